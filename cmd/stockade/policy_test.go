package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/store"
)

// TestPolicyNetworkWords checks `policy set --network` with the words of
// the API, allow and deny, and the older allowed and denied, and that the
// policy's view says network in the same words; and that --max-timeout
// reads durations as every other flag does.
func TestPolicyNetworkWords(t *testing.T) {
	dir := t.TempDir()
	if code, _, stderr := runCLI(t, nil, "workspace", "create", "demo", "--data-dir", dir); code != 0 {
		t.Fatalf("workspace create: exit %d: %s", code, stderr)
	}
	tests := []struct {
		flags        []string
		network      string
		maxTimeoutMS int64
	}{
		{[]string{"--network=allow"}, "allow", 0},
		{[]string{"--network=deny"}, "deny", 0},
		{[]string{"--network=allowed"}, "allow", 0},
		{[]string{"--network=denied"}, "deny", 0},
		{[]string{"--max-timeout=2m"}, "deny", 120_000},
		{[]string{"--max-timeout", "1m30s"}, "deny", 90_000},
		{[]string{"--max-timeout", "2 min"}, "deny", 120_000},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.flags, " "), func(t *testing.T) {
			args := append([]string{"policy", "set", "demo", "--data-dir", dir}, tt.flags...)
			code, stdout, stderr := runCLI(t, nil, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var view map[string]any
			if err := json.Unmarshal([]byte(stdout), &view); err != nil {
				t.Fatalf("policy view %q: %v", stdout, err)
			}
			if view["network"] != tt.network {
				t.Errorf("got network %v, want %q (view %s)", view["network"], tt.network, stdout)
			}
			if _, ok := view["network_allowed"]; ok {
				t.Errorf("view %s still says network_allowed", stdout)
			}
			if tt.maxTimeoutMS != 0 && view["max_timeout_ms"] != float64(tt.maxTimeoutMS) {
				t.Errorf("got max_timeout_ms %v, want %d", view["max_timeout_ms"], tt.maxTimeoutMS)
			}
		})
	}
	for _, bad := range []string{"--network=maybe", "--network=", "--max-timeout=30", "--max-timeout=-1s", "--max-timeout=0"} {
		t.Run(bad, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, nil, "policy", "set", "demo", "--data-dir", dir, bad)
			if code != 2 || stdout != "" || len(strings.Split(strings.TrimSpace(stderr), "\n")) != 1 {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit 2 and a one-line error", code, stdout, stderr)
			}
		})
	}
}

// TestPolicySessions checks `policy set --approval=per_session` and
// --max-sessions, and their refusals.
func TestPolicySessions(t *testing.T) {
	dir := t.TempDir()
	if code, _, stderr := runCLI(t, nil, "workspace", "create", "demo", "--data-dir", dir); code != 0 {
		t.Fatalf("workspace create: exit %d: %s", code, stderr)
	}
	code, stdout, stderr := runCLI(t, nil, "policy", "set", "demo", "--data-dir", dir, "--approval=per_session", "--max-sessions=3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var view map[string]any
	if err := json.Unmarshal([]byte(stdout), &view); err != nil {
		t.Fatalf("policy view %q: %v", stdout, err)
	}
	if view["approval"] != "per_session" || view["max_sessions"] != float64(3) {
		t.Errorf("got approval %v, max_sessions %v; want per_session and 3 (view %s)", view["approval"], view["max_sessions"], stdout)
	}
	for _, bad := range []string{"--approval=sometimes", "--max-sessions=-1"} {
		t.Run(bad, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, nil, "policy", "set", "demo", "--data-dir", dir, bad)
			if code != 2 || stdout != "" {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit 2", code, stdout, stderr)
			}
		})
	}
}

// TestPolicyForkApproval checks `policy set --fork-approval`: anew by
// default, inherit when set, kept by a change of another field, audited
// in policy.updated, and a word that is neither refused.
func TestPolicyForkApproval(t *testing.T) {
	db := "sqlite:" + filepath.Join(t.TempDir(), "stockade.db")
	mustCLI(t, "workspace", "create", "demo", "--db", db)
	show := func(args ...string) map[string]any {
		t.Helper()
		var view map[string]any
		out := mustCLI(t, append([]string{"policy"}, append(args, "demo", "--db", db)...)...)
		if err := json.Unmarshal([]byte(out), &view); err != nil {
			t.Fatalf("policy view %q: %v", out, err)
		}
		return view
	}
	if v := show("show"); v["fork_approval"] != "anew" {
		t.Fatalf("a new workspace's fork_approval: got %v, want anew", v["fork_approval"])
	}
	if v := show("set", "--approval=per_session", "--fork-approval=inherit"); v["fork_approval"] != "inherit" || v["approval"] != "per_session" {
		t.Fatalf("after --fork-approval=inherit: got %v", v)
	}
	if v := show("set", "--max-sessions=2"); v["fork_approval"] != "inherit" {
		t.Fatalf("another field's change: got fork_approval %v, want inherit kept", v["fork_approval"])
	}
	code, stdout, stderr := cli(t, "policy", "set", "demo", "--db", db, "--fork-approval=sometimes")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "anew or inherit") {
		t.Errorf("--fork-approval=sometimes: got exit %d, stdout %q, stderr %q; want exit 2", code, stdout, stderr)
	}

	st, err := storeopen.Open(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ws, err := st.GetWorkspaceByName(t.Context(), "demo")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := st.ListEvents(t.Context(), ws.ID, store.EventFilter{Types: []string{"policy.updated"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 2 {
		t.Fatalf("policy.updated events: got %d, want 2", len(evs.Items))
	}
	// The list is newest first: the change of fork_approval is the older.
	var change struct {
		Before, After struct {
			ForkApproval string `json:"fork_approval"`
		}
	}
	if err := json.Unmarshal(evs.Items[1].Data, &change); err != nil || change.Before.ForkApproval != "anew" || change.After.ForkApproval != "inherit" {
		t.Errorf("the change of fork_approval: got %s (%v), want fork_approval anew before and inherit after", evs.Items[1].Data, err)
	}
}
