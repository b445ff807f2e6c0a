package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/store"
)

// TestHelp checks that --help (and -h, and help VERB) of every command and
// verb prints its usage on stdout and exits 0, before anything else is
// looked at: `policy show --help` is help, not a workspace named "--help".
func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"help"}, {"help", "run"},
		{"run", "--help"}, {"run", "-h"}, {"run", "--runtime", "python", "--help"},
		{"serve", "--help"}, {"setup", "--help"}, {"version", "--help"},
		{"workspace", "--help"}, {"workspace", "create", "--help"}, {"workspace", "list", "--help"},
		{"key", "--help"}, {"key", "create", "--help"}, {"key", "list", "--help"}, {"key", "revoke", "--help"},
		{"credits", "--help"}, {"credits", "grant", "--help"}, {"credits", "show", "--help"},
		{"policy", "--help"}, {"policy", "show", "--help"}, {"policy", "set", "--help"}, {"policy", "set", "demo", "-h"},
		{"image", "--help"}, {"image", "build", "--help"}, {"image", "list", "--help"},
		{"tools", "--help"}, {"tools", "lint", "--help"}, {"tools", "record", "--help"},
		{"audit", "--help"}, {"audit", "verify", "--help"}, {"audit", "blast-radius", "--help"},
		{"driver", "--help"}, {"driver", "check", "--help"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, out, errOut := cli(t, args...)
			if code != 0 || !strings.HasPrefix(out, "usage: stockade") || errOut != "" {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit 0, usage on stdout, nothing on stderr", code, out, errOut)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	want := regexp.MustCompile(`^stockade \S+ \(go\S+ \S+/\S+\)\n$`)
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out, errOut := cli(t, args...)
		if code != 0 || !want.MatchString(out) {
			t.Errorf("stockade %s: got exit %d, stdout %q, stderr %q; want exit 0 and %s", args[0], code, out, errOut, want)
		}
	}
}

// TestAdminCommands runs the admin commands on a fresh database: flags
// before or after the positional arguments, and bad input as one line in
// the user's words with exit status 2.
func TestAdminCommands(t *testing.T) {
	db := "sqlite:" + filepath.Join(t.TempDir(), "stockade.db")
	mustCLI(t, "workspace", "create", "demo", "--db", db)
	if out := mustCLI(t, "policy", "set", "--approval=none", "--db", db, "demo"); !strings.Contains(out, `"approval": "none"`) {
		t.Errorf("policy set with flags before the name: got %s, want approval none", out)
	}
	if out := mustCLI(t, "policy", "set", "demo", "--network=allowed", "--db", db); !strings.Contains(out, `"approval": "none"`) || !strings.Contains(out, `"network": "allow"`) {
		t.Errorf("policy set with flags after the name: got %s, want approval none kept and network allowed", out)
	}
	if out := mustCLI(t, "credits", "grant", "--db", db, "demo", "10"); out != "available 10\treserved 0\n" {
		t.Errorf("credits grant: got %q", out)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // the whole line on stderr
	}{
		{"duplicate workspace", []string{"workspace", "create", "demo"}, `stockade: workspace "demo" already exists`},
		{"negative credits", []string{"credits", "grant", "demo", "-5"}, `stockade: credits grant: N must be a positive whole number, got "-5"`},
		{"credits not a number", []string{"credits", "grant", "demo", "many"}, `stockade: credits grant: N must be a positive whole number, got "many"`},
		{"unknown workspace", []string{"policy", "show", "nope"}, `stockade: workspace named "nope" not found`},
		{"unknown flag", []string{"policy", "set", "demo", "--approvals=none"}, "stockade: policy set: flag provided but not defined: -approvals (stockade policy set --help lists the flags)"},
		{"bad flag value", []string{"policy", "set", "demo", "--approval=maybe"}, `stockade: --approval must be required, per_session or none, got "maybe"`},
		{"no name", []string{"policy", "show"}, "stockade: policy show takes one workspace NAME, got 0 arguments (stockade policy show --help)"},
		{"unknown verb", []string{"workspace", "delete", "demo"}, `stockade: unknown workspace verb "delete" (want create, list; stockade workspace --help)`},
		{"unknown command", []string{"wrkspace"}, `stockade: unknown command "wrkspace" (stockade --help lists them)`},
		{"unknown key", []string{"key", "revoke", "key_nope"}, `stockade: key "key_nope" not found`},
		{"key without role", []string{"key", "create", "--workspace", "demo"}, `stockade: key create: --role must be agent, approver or admin, got ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := cli(t, append(tc.args, "--db", db)...)
			if code != exitUsage || out != "" || !strings.HasPrefix(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit 2, nothing on stdout, one line starting %q", code, out, errOut, tc.want)
			}
			for _, db := range []string{"constraint", "(2067)", "invalid argument", "not found:", "conflict"} {
				if strings.Contains(errOut, db) {
					t.Errorf("stderr %q says %q: the database's words, or an error class, not the user's", errOut, db)
				}
			}
		})
	}
}

// TestKeys creates, lists and revokes keys: create prints the key alone on
// stdout (AGENT=$(stockade key create ...) as the README does) and its id
// on stderr; list names ids, roles, labels, creation, last use and
// revocation, never a key; a revocation is an audit event of the
// workspace.
func TestKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stockade.db")
	db := "sqlite:" + path
	mustCLI(t, "workspace", "create", "demo", "--db", db)
	code, key, errOut := cli(t, "key", "create", "--workspace", "demo", "--role", "agent", "--name", "ci agent", "--db", db)
	if code != 0 || !regexp.MustCompile(`^sk_[A-Za-z0-9_-]{43}\n$`).MatchString(key) {
		t.Fatalf("key create: got exit %d, stdout %q; want exit 0 and the key alone", code, key)
	}
	id := regexp.MustCompile(`key_[a-z2-7]+`).FindString(errOut)
	if id == "" {
		t.Fatalf("key create: stderr %q names no key id", errOut)
	}
	mustCLI(t, "key", "create", "--workspace", "demo", "--role", "approver", "--db", db)

	// A use the daemon recorded shows in the list.
	st, err := storeopen.Open(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	used := time.Date(2026, 3, 1, 12, 30, 5, 0, time.UTC)
	if err := st.RecordKeyUses(t.Context(), map[string]time.Time{id: used}); err != nil {
		t.Fatal(err)
	}
	list := mustCLI(t, "key", "list", "--workspace", "demo", "--db", db)
	lines := strings.Split(strings.TrimSpace(list), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") {
		t.Fatalf("key list: got %q, want a header and two keys", list)
	}
	for _, want := range []string{"ROLE", "LABEL", "CREATED", "LAST USED", "REVOKED"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("key list header %q lacks %s", lines[0], want)
		}
	}
	if f := strings.Fields(lines[1]); f[0] != id || f[1] != "agent" || !strings.Contains(lines[1], "ci agent") ||
		!strings.Contains(lines[1], "2026-03-01 12:30:05Z") || !strings.HasSuffix(lines[1], "-") {
		t.Errorf("key list: got %q, want %s, agent, its label, its last use and not revoked", lines[1], id)
	}
	if strings.Contains(list, "sk_") || strings.Contains(list, strings.TrimSpace(key)[3:13]) {
		t.Errorf("key list shows a key: %q", list)
	}

	if out := mustCLI(t, "key", "revoke", id, "--db", db); out != "revoked key "+id+"\n" {
		t.Errorf("key revoke: got %q", out)
	}
	if out := mustCLI(t, "key", "revoke", id, "--db", db); !strings.HasPrefix(out, "key "+id+" was already revoked at ") {
		t.Errorf("key revoke again: got %q", out)
	}
	list = mustCLI(t, "key", "list", "--workspace", "demo", "--db", db)
	if line := strings.Split(list, "\n")[1]; strings.HasSuffix(line, "-") {
		t.Errorf("key list after the revocation: got %q, want a revocation time", line)
	}
	ws, err := st.GetWorkspaceByName(t.Context(), "demo")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := st.ListEvents(t.Context(), ws.ID, store.EventFilter{Types: []string{"key.revoked"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 1 || evs.Items[0].Code != "ADM005I" || evs.Items[0].Actor != "cli" {
		t.Fatalf("key.revoked events: got %+v, want one by the cli", evs.Items)
	}
	var data map[string]string
	if err := json.Unmarshal(evs.Items[0].Data, &data); err != nil || data["key_id"] != id || data["role"] != "agent" {
		t.Errorf("key.revoked data: got %s, want key_id %s and role agent", evs.Items[0].Data, id)
	}
	mustCLI(t, "audit", "verify", "--db", db)
}
