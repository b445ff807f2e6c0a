package mcp

import (
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

func TestParseTaskID(t *testing.T) {
	for _, tc := range []struct {
		in       string
		kind, id string
	}{
		{TaskID(taskCode, "ex_123"), taskCode, "ex_123"},
		{TaskID(taskCell, "ex_a-B"), taskCell, "ex_a-B"},
		{"code:", "", ""},
		{"code", "", ""},
		{"run:ex_1", "", ""},
		{"code:ex/1", "", ""},
		{"code:ex:1", "", ""},
		{"code:" + strings.Repeat("x", maxTaskID), "", ""},
	} {
		kind, id, err := ParseTaskID(tc.in)
		if kind != tc.kind || id != tc.id || (err == nil) != (tc.kind != "") {
			t.Errorf("ParseTaskID(%q): got %q, %q, %v; want %q, %q", tc.in, kind, id, err, tc.kind, tc.id)
		}
		if err != nil && !errdefs.IsNotFound(err) && !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseTaskID(%q): error %v is of no class", tc.in, err)
		}
	}
}

// FuzzParseTaskID checks that a task id a client sends decodes to a kind
// and an execution id that make it again, or to a classed error.
func FuzzParseTaskID(f *testing.F) {
	for _, s := range []string{"code:ex_1", "cell:ex_2", "", ":", "code:", "cell:ex:1", "code:ex\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		kind, id, err := ParseTaskID(s)
		if err != nil {
			if !errdefs.IsNotFound(err) && !errdefs.IsInvalidArgument(err) {
				t.Fatalf("ParseTaskID(%q): error %v is of no class", s, err)
			}
			return
		}
		if TaskID(kind, id) != s {
			t.Fatalf("ParseTaskID(%q) = %q, %q, which make %q", s, kind, id, TaskID(kind, id))
		}
	})
}
