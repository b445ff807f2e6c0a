// Package registrytest runs Debian's docker-registry for tests: on a
// loopback port, with a temporary store, behind a proxy that counts the
// requests by method.
package registrytest

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/testenv"
)

// Start starts a registry for t, stopped when t ends, and returns the
// proxy's host:port and a function that returns the requests counted by
// method since its last call. Without docker-registry on PATH t skips,
// or fails in CI (scripts/test.sh installs it).
func Start(t testing.TB) (string, func() map[string]int) {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		testenv.Missing(t, "docker-registry is not installed (apt-get install docker-registry)")
	}
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	conf := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: %s}
http:
  addr: %s
`, filepath.Join(dir, "store"), addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", conf)
	var out testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("docker-registry did not answer on %s: %v\n%s", addr, err, strings.TrimSpace(out.String()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	target, _ := url.Parse("http://" + addr)
	var mu sync.Mutex
	counts := map[string]int{}
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		counts[r.Method]++
		mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		c := counts
		counts = map[string]int{}
		return c
	}
}
