package npm_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/npm"
)

// TestTarballOrigin gives packages tarball URLs off the registry's origin
// (another port, another host, another scheme, a redirect to another
// server): Resolve and Install refuse them, naming the package, and the
// other server is never asked.
func TestTarballOrigin(t *testing.T) {
	var elsewhere int
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere++
		w.Write([]byte("not a tarball"))
	}))
	t.Cleanup(other.Close)

	good := newRegistry(t, fakePkg{name: "ok", version: "1.0.0"})
	pkgs, err := npm.Resolve(context.Background(), good.URL, []string{"ok@1.0.0"})
	if err != nil || len(pkgs) != 1 || !strings.HasPrefix(pkgs[0].Resolved, good.URL+"/") {
		t.Fatalf("Resolve on the registry's origin = %+v, %v; want ok@1.0.0 from %s", pkgs, err, good.URL)
	}

	for _, url := range []string{
		other.URL + "/tarballs/far-1.0.0.tgz",
		"http://169.254.169.254/latest/far-1.0.0.tgz",
		"https" + strings.TrimPrefix(good.URL, "http") + "/tarballs/far-1.0.0.tgz",
	} {
		reg := newRegistry(t, fakePkg{name: "top", version: "1.0.0", deps: map[string]string{"far": "1.0.0"}},
			fakePkg{name: "far", version: "1.0.0", tarballURL: url})
		_, err := npm.Resolve(context.Background(), reg.URL, []string{"top@1.0.0"})
		msg, public := errdefs.PublicMessage(err)
		if !public || !errdefs.IsInvalidArgument(err) || !strings.Contains(msg, `"top@1.0.0": far@1.0.0: its tarball URL`) ||
			!strings.Contains(msg, "not on the registry's origin") {
			t.Errorf("Resolve with tarball %s: %v; want a public error naming far@1.0.0 and the origin", url, err)
		}
		// Install, given such a package, refuses it before fetching.
		far := npm.Package{Name: "far", Version: "1.0.0", Path: "far", Resolved: url, Integrity: pkgs[0].Integrity}
		err = npm.Install(context.Background(), reg.URL, []npm.Package{far}, t.TempDir(), t.TempDir())
		if msg, _ := errdefs.PublicMessage(err); !strings.Contains(msg, "far@1.0.0: its tarball URL") || !strings.Contains(msg, "not on the registry's origin") {
			t.Errorf("Install with tarball %s: %v; want a refusal naming far@1.0.0", url, err)
		}
	}

	// A tarball on the registry that redirects to another server.
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusFound)
	}))
	t.Cleanup(redirecting.Close)
	moved := pkgs[0]
	moved.Resolved = redirecting.URL + "/tarballs/ok-1.0.0.tgz"
	err = npm.Install(context.Background(), redirecting.URL, []npm.Package{moved}, t.TempDir(), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "another origin") {
		t.Errorf("Install through a redirect off the origin: %v; want an error saying so", err)
	}
	if elsewhere != 0 {
		t.Errorf("the other server got %d requests, want 0", elsewhere)
	}
}
