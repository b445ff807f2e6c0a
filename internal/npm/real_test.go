package npm_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/npm"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// realRegistry is the public npm registry, which the tests' machines
// reach (CI's too).
const realRegistry = "https://registry.npmjs.org"

// requireRegistry gates a test on reaching the public registry.
func requireRegistry(t *testing.T) {
	t.Helper()
	c, err := net.DialTimeout("tcp", "registry.npmjs.org:443", 5*time.Second)
	if err != nil {
		testenv.Missing(t, "the npm registry is not reachable: "+err.Error())
		return
	}
	c.Close()
}

// TestRealRegistry resolves and installs, from the public registry, a
// package without dependencies (left-pad@1.3.0) and one with a pinned
// dependency (debug@4.3.4, which needs ms@2.1.2), checks their integrity
// is sha512, and has node require them from a script in the tree.
func TestRealRegistry(t *testing.T) {
	requireRegistry(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pkgs, err := npm.Resolve(ctx, realRegistry, []string{"left-pad@1.3.0", "debug@4.3.4"})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if got, want := layout(pkgs), "debug=4.3.4 left-pad=1.3.0 ms=2.1.2"; got != want {
		t.Fatalf("Resolve layout: got %s, want %s", got, want)
	}
	for _, p := range pkgs {
		if !strings.HasPrefix(p.Integrity, "sha512-") || p.Scripts || !strings.HasPrefix(p.Resolved, realRegistry+"/") {
			t.Errorf("%s: integrity %q, scripts %v, resolved %q; want sha512, none, from the registry", p.Name, p.Integrity, p.Scripts, p.Resolved)
		}
	}
	root, cache := t.TempDir(), t.TempDir()
	if err := npm.Install(ctx, realRegistry, pkgs, root, cache); err != nil {
		t.Fatalf("Install: %v", err)
	}
	out := runNode(t, root, `const leftPad = require('left-pad'), ms = require('ms'), debug = require('debug');
console.log(leftPad('7', 3, '0'), ms('2h'), typeof debug('t'), require('debug/package.json').version);`)
	if want := "007 7200000 function 4.3.4"; out != want {
		t.Errorf("node: %q, want %q", out, want)
	}
	// A second install into another tree reads the cache.
	if err := npm.Install(ctx, realRegistry, pkgs, t.TempDir(), cache); err != nil {
		t.Errorf("Install from the cache: %v", err)
	}
}
