package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestEnvironment checks that each variable a command's help names (env
// X) is read by that command, and that a flag given wins over it: the
// daemon of STOCKADE_URL is called by run (exactly as with --url) and by
// the session verbs, a flag that chooses the local sandbox is refused with
// a daemon from the environment, --url "" runs here, and the admin
// commands open the database of STOCKADE_DB or STOCKADE_DATA_DIR.
func TestEnvironment(t *testing.T) {
	var mu sync.Mutex
	var calls []string // "METHOD PATH key"
	daemon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.Path+" "+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":{"code":"unauthenticated","message":"invalid or revoked API key"}}`))
	}))
	defer daemon.Close()

	dir := t.TempDir()
	db := "sqlite:" + filepath.Join(dir, "env.db")
	mustCLI(t, "workspace", "create", "fromenvdb", "--db", db)
	dataDir := filepath.Join(dir, "data")
	remote := []string{"STOCKADE_URL=" + daemon.URL, "STOCKADE_KEY=sk_fromenv"}
	for _, tc := range []struct {
		name   string
		env    []string
		args   []string
		status int
		call   string // the request the daemon must see; empty: none
		out    string // in stdout or stderr
	}{
		{"run remote by STOCKADE_URL", remote, []string{"run", "--runtime", "python", "-c", "print(1)"}, exitUsage, "POST /v1/executions sk_fromenv", "invalid or revoked API key"},
		{"run --key wins over STOCKADE_KEY", remote, []string{"run", "--key", "sk_flag", "--runtime", "python", "-c", "print(1)"}, exitUsage, "POST /v1/executions sk_flag", ""},
		{"run --url wins over STOCKADE_URL", append(remote[:1:1], "STOCKADE_KEY=sk_x"), []string{"run", "--url", "http://127.0.0.1:1", "--runtime", "python", "-c", "print(1)"}, 1, "", "127.0.0.1:1"},
		{"run refuses --driver with STOCKADE_URL", remote, []string{"run", "--driver", "runc", "--runtime", "python", "-c", "print(1)"}, exitUsage, "", "--driver does not apply with STOCKADE_URL"},
		{"run refuses --memory with STOCKADE_URL", remote, []string{"run", "--memory", "64MiB", "--runtime", "python", "-c", "print(1)"}, exitUsage, "", "--memory does not apply with STOCKADE_URL"},
		{"run --url empty runs here", remote, []string{"run", "--url", "", "--state-dir", dir, "--runc", "/nonexistent/runc", "--driver", "runc", "--runtime", "python", "-c", "print(1)"}, exitRunFailure, "", "/nonexistent/runc"},
		{"run on the cluster of STOCKADE_DRIVER=kubernetes and STOCKADE_KUBECONFIG", []string{"STOCKADE_DRIVER=kubernetes", "STOCKADE_KUBECONFIG=/nonexistent/kubeconfig"}, []string{"run", "--url", "", "--data-dir", t.TempDir(), "--state-dir", dir, "--runtime", "python", "-c", "print(1)"}, exitUsage, "", "/nonexistent/kubeconfig"},
		{"session list by STOCKADE_URL", remote, []string{"session", "list"}, exitUsage, "GET /v1/sessions sk_fromenv", "invalid or revoked API key"},
		{"workspace list by STOCKADE_DB", []string{"STOCKADE_DB=" + db}, []string{"workspace", "list"}, 0, "", "fromenvdb"},
		{"--db wins over STOCKADE_DB", []string{"STOCKADE_DB=sqlite:/nonexistent/dir/x.db"}, []string{"workspace", "list", "--db", db}, 0, "", "fromenvdb"},
		{"workspace create by STOCKADE_DATA_DIR", []string{"STOCKADE_DATA_DIR=" + dataDir}, []string{"workspace", "create", "indatadir"}, 0, "", ""},
		{"image verify by STOCKADE_DATA_DIR", []string{"STOCKADE_DATA_DIR=" + dir}, []string{"image", "verify"}, 1, "", `image "python" is not built`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			calls = nil
			mu.Unlock()
			status, stdout, stderr := runWithEnv(t, tc.env, tc.args...)
			mu.Lock()
			got := strings.Join(calls, "; ")
			mu.Unlock()
			if status != tc.status {
				t.Errorf("got exit %d, want %d (stdout %q, stderr %q)", status, tc.status, stdout, stderr)
			}
			if tc.call == "" && got != "" || tc.call != "" && !strings.HasPrefix(got, tc.call) {
				t.Errorf("daemon saw %q, want %q", got, tc.call)
			}
			if !strings.Contains(stdout+stderr, tc.out) {
				t.Errorf("got stdout %q, stderr %q; want %q in them", stdout, stderr, tc.out)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dataDir, "stockade.db")); err != nil {
		t.Errorf("STOCKADE_DATA_DIR: %v, want the database made there", err)
	}
}
