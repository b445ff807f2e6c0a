package tools

import (
	"strings"
	"testing"
)

func TestCheckDomainWildcards(t *testing.T) {
	for _, tc := range []struct {
		domain string
		want   string // a fragment of the problem; "" for none
	}{
		{"*.example.com", ""},
		{"*.example.co.uk", ""},
		{"*.stockade-sh.github.io", ""},
		{"co.uk", ""},
		{"*.com", "a wildcard must cover a registered domain"},
		{"*.co.uk", "not the public suffix co.uk"},
		{"*.com.au", "not the public suffix com.au"},
		{"*.github.io", "not the public suffix github.io"},
		{"*.s3.amazonaws.com", "not the public suffix s3.amazonaws.com"},
	} {
		t.Run(tc.domain, func(t *testing.T) {
			got := checkDomain(tc.domain)
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("checkDomain(%q) = %q, want a problem containing %q", tc.domain, got, tc.want)
			}
		})
	}
}
