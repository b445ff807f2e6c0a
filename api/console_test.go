package api_test

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestDaemonServesTheConsole checks that `stockade serve` mounts the
// approval console at /ui/ beside the API: its sign-in page answers with
// its security headers, and the API still answers its own paths.
func TestDaemonServesTheConsole(t *testing.T) {
	requireSandboxes(t)
	bin := testenv.Build(t, "./cmd/stockade")
	dir := t.TempDir()
	_, args := setUpDaemon(t, bin, dir, "sqlite:"+filepath.Join(dir, "stockade.db"), filepath.Join(dir, "state"))
	d := startDaemon(t, bin, args...)
	r := do(t, d.url, "GET", "/ui/sign-in", "", nil).want(t, http.StatusOK)
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") || !strings.Contains(string(r.body), `name="key"`) {
		t.Errorf("GET /ui/sign-in: got %s, want the sign-in form", ct)
	}
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy: got %q", csp)
	}
	do(t, d.url, "GET", "/ui/approvals", "", nil).want(t, http.StatusUnauthorized)
	do(t, d.url, "GET", "/v1/workspace", "", nil).want(t, http.StatusUnauthorized)
	d.stop()
}
