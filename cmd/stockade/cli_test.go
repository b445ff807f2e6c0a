package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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
		{"key", "--help"}, {"key", "create", "--help"},
		{"credits", "--help"}, {"credits", "grant", "--help"}, {"credits", "show", "--help"},
		{"policy", "--help"}, {"policy", "show", "--help"}, {"policy", "set", "--help"}, {"policy", "set", "demo", "-h"},
		{"image", "--help"}, {"image", "build", "--help"}, {"image", "list", "--help"},
		{"tools", "--help"}, {"tools", "lint", "--help"}, {"tools", "record", "--help"},
		{"audit", "--help"}, {"audit", "verify", "--help"}, {"audit", "blast-radius", "--help"},
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
	if out := mustCLI(t, "policy", "set", "demo", "--network=allowed", "--db", db); !strings.Contains(out, `"approval": "none"`) || !strings.Contains(out, `"network_allowed": true`) {
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
		{"unknown workspace", []string{"policy", "show", "nope"}, `stockade: getting workspace named "nope"`},
		{"unknown flag", []string{"policy", "set", "demo", "--approvals=none"}, "stockade: policy set: flag provided but not defined: -approvals (stockade policy set --help lists the flags)"},
		{"bad flag value", []string{"policy", "set", "demo", "--approval=maybe"}, `stockade: --approval must be required or none, got "maybe"`},
		{"no name", []string{"policy", "show"}, "stockade: policy show takes one workspace NAME, got 0 arguments (stockade policy show --help)"},
		{"unknown verb", []string{"workspace", "delete", "demo"}, `stockade: unknown workspace verb "delete" (want create, list; stockade workspace --help)`},
		{"unknown command", []string{"wrkspace"}, `stockade: unknown command "wrkspace" (stockade --help lists them)`},
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
