package mcp

import (
	"net/url"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		ok   bool
	}{
		{"zero", Options{}, true},
		{"relative template", Options{ApprovalURL: "/console/approvals/{id}"}, true},
		{"absolute template", Options{ApprovalURL: "https://console.example.com/a/{id}?from=mcp"}, true},
		{"no {id}", Options{ApprovalURL: "/ui/approvals"}, false},
		{"negative wait", Options{ApprovalWait: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.ok && err != nil || !tc.ok && !errdefs.IsInvalidArgument(err) {
				t.Errorf("got %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestApprovalURL(t *testing.T) {
	base, _ := url.Parse("http://127.0.0.1:8700")
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"default", Options{BaseURL: base}, "http://127.0.0.1:8700/ui/approvals/apr_1"},
		{"relative", Options{BaseURL: base, ApprovalURL: "/console/#/a/{id}"}, "http://127.0.0.1:8700/console/#/a/apr_1"},
		{"absolute", Options{BaseURL: base, ApprovalURL: "https://c.example.com/{id}"}, "https://c.example.com/apr_1"},
		{"no base", Options{}, "/ui/approvals/apr_1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.o.withDefaults().approvalURL("apr_1"); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
