package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"

	"github.com/stockade-sh/stockade/errdefs"
)

func TestParseLocation(t *testing.T) {
	for _, tc := range []struct {
		in       string
		insecure bool
		want     Location // zero: refused
	}{
		{"registry.example:5000/team/stockade", false, Location{Host: "registry.example:5000", Prefix: "team/stockade", Scheme: "https"}},
		{"https://registry.example/", false, Location{Host: "registry.example", Scheme: "https"}},
		{"http://127.0.0.1:5000/s", false, Location{Host: "127.0.0.1:5000", Prefix: "s", Scheme: "http"}},
		{"http://localhost:5000", false, Location{Host: "localhost:5000", Scheme: "http"}},
		{"http://[::1]:5000", false, Location{Host: "[::1]:5000", Scheme: "http"}},
		{"http://10.250.250.1:5000/stockade", true, Location{Host: "10.250.250.1:5000", Prefix: "stockade", Scheme: "http"}},
		{"http://10.250.250.1:5000/stockade", false, Location{}},
		{"ftp://registry.example", false, Location{}},
		{"registry.example/Upper", false, Location{}},
		{"registry.example/a//b", false, Location{}},
		{"registry.example/a-", false, Location{}},
		{"user@registry.example", false, Location{}},
		{"", false, Location{}},
	} {
		got, err := ParseLocation(tc.in, tc.insecure)
		if got != tc.want || (err == nil) != (tc.want != Location{}) {
			t.Errorf("ParseLocation(%q, %v) = %+v, %v; want %+v", tc.in, tc.insecure, got, err, tc.want)
		}
		if err != nil && !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseLocation(%q): %v, want ErrInvalidArgument", tc.in, err)
		}
	}
	// kubernetes.registry's form: no scheme, the same grammar.
	for in, ok := range map[string]bool{"10.250.250.1:5000/stockade": true, "registry.example": true,
		"http://127.0.0.1:5000": false, "registry.example/Team": false, "r:5000/a@sha256:00": false} {
		if got, err := ParseReference(in); (err == nil) != ok || (ok && got.Scheme != "https") {
			t.Errorf("ParseReference(%q) = %+v, %v; want ok %v", in, got, err, ok)
		}
	}
	loc := Location{Host: "r:5000", Prefix: "a/b"}
	if got := loc.Ref("python", "sha256:00"); got != "r:5000/a/b/python@sha256:00" {
		t.Errorf("Ref = %s", got)
	}
}

// TestNoPasswordInClear holds that basic auth never goes over plain http
// to a host that is not loopback.
func TestNoPasswordInClear(t *testing.T) {
	if _, err := New(Location{Host: "10.0.0.1:5000", Scheme: "http"}, Options{Username: "u", Password: "p"}); err == nil {
		t.Fatal("New accepted a password over plain http to 10.0.0.1")
	}
	if _, err := New(Location{Host: "127.0.0.1:5000", Scheme: "http"}, Options{Username: "u", Password: "p"}); err != nil {
		t.Fatalf("New refused a password to loopback: %v", err)
	}
}

// TestRedirectElsewhereRefused holds that a redirect of an https registry
// to plain http (another port of the same host, as a TLS proxy writing
// http:// locations does) is refused and sends nothing there, with the
// client New makes and with a caller's Options.HTTP; a redirect on the
// same origin is still followed, with the credentials.
func TestRedirectElsewhereRefused(t *testing.T) {
	var plain []string
	plainSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plain = append(plain, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusNotFound)
	}))
	defer plainSrv.Close()
	manifest := []byte("{}")
	sum := sha256.Sum256(manifest)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	var moved []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/moved/"):
			moved = append(moved, r.Header.Get("Authorization"))
			w.Header().Set("Docker-Content-Digest", digest)
			w.WriteHeader(http.StatusOK)
		case strings.HasPrefix(r.URL.Path, "/v2/same/"):
			http.Redirect(w, r, "/moved"+r.URL.Path, http.StatusTemporaryRedirect)
		default:
			http.Redirect(w, r, plainSrv.URL+r.URL.Path, http.StatusTemporaryRedirect)
		}
	}))
	defer srv.Close()
	loc, err := ParseLocation(srv.URL, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, given := range []bool{false, true} {
		opts := Options{Username: "u", Password: "secret"}
		if given {
			opts.HTTP = srv.Client()
		}
		c, err := New(loc, opts)
		if err != nil {
			t.Fatal(err)
		}
		if !given {
			c.http.Transport = srv.Client().Transport // trusts srv's certificate
		}
		moved, plain = nil, nil
		got, st, err := c.Push(context.Background(), "same", "tag", nil, manifest)
		if err != nil || got != digest || st.ManifestPut || len(moved) != 1 || !strings.HasPrefix(moved[0], "Basic ") {
			t.Fatalf("Options.HTTP given %v: push redirected on the same origin: %s, %+v, %v; the target saw %q", given, got, st, err, moved)
		}
		_, _, err = c.Push(context.Background(), "name", "tag", nil, manifest)
		if err == nil || !strings.Contains(err.Error(), "another scheme or host") || !errdefs.IsFailedPrecondition(err) || len(plain) != 0 {
			t.Fatalf("Options.HTTP given %v: push redirected to http: %v; the http server saw %q", given, err, plain)
		}
	}
	if srv.Client().CheckRedirect != nil {
		t.Error("New changed the caller's http.Client")
	}
}

// TestResolve holds that Resolve takes the digest of a HEAD's
// Docker-Content-Digest, hashes the manifest of a GET where the registry
// sends none (refusing one whose bytes do not match the digest it
// sends), and classes a missing tag as ErrNotFound.
func TestResolve(t *testing.T) {
	manifest := []byte(`{"schemaVersion":2}`)
	sum := sha256.Sum256(manifest)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	var header string // the GET's Docker-Content-Digest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v2/p/withdigest/manifests/t":
			w.Header().Set("Docker-Content-Digest", digest)
		case "/v2/p/nodigest/manifests/t":
			if r.Method == http.MethodGet {
				if header != "" {
					w.Header().Set("Docker-Content-Digest", header)
				}
				w.Write(manifest)
			}
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	loc, err := ParseLocation(srv.URL+"/p", false)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(loc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"withdigest", "nodigest"} {
		if got, err := c.Resolve(t.Context(), name, "t"); err != nil || got != digest {
			t.Errorf("Resolve %s: %s, %v; want %s", name, got, err, digest)
		}
	}
	header = "sha256:" + strings.Repeat("0", 64)
	if got, err := c.Resolve(t.Context(), "nodigest", "t"); err == nil || !errdefs.IsUnavailable(err) {
		t.Errorf("Resolve of a manifest whose digest is not its bytes': %s, %v", got, err)
	}
	if got, err := c.Resolve(t.Context(), "missing", "t"); !errdefs.IsNotFound(err) {
		t.Errorf("Resolve of a missing tag: %s, %v; want NotFound", got, err)
	}
}

// TestUploadElsewhereRefused holds that an upload location on another
// host is refused (the credentials would go there), and that the
// registry's error messages reach the error.
func TestUploadElsewhereRefused(t *testing.T) {
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = append(auth, r.Header.Get("Authorization"))
		switch {
		case r.Method == http.MethodHead:
			w.WriteHeader(http.StatusNotFound)
		case r.Method == http.MethodPost && strings.Contains(r.URL.Path, "/other/"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"errors":[{"code":"DENIED","message":"requested access\nto the \u202eresource is denied"}]}`)
		case r.Method == http.MethodPost:
			w.Header().Set("Location", "http://elsewhere.invalid/upload/1")
			w.WriteHeader(http.StatusAccepted)
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL)
		}
	}))
	defer srv.Close()
	loc, err := ParseLocation("http://"+srv.Listener.Addr().String(), false)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(loc, Options{Username: "u", Password: "p"})
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("layer")
	sum := sha256.Sum256(data)
	blob := Blob{Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data)), Write: func(w io.Writer) error { _, err := w.Write(data); return err }}
	_, _, err = c.Push(context.Background(), "name", "tag", []Blob{blob}, []byte("{}"))
	if err == nil || !strings.Contains(err.Error(), "another host") {
		t.Fatalf("push with an upload elsewhere: %v", err)
	}
	if len(auth) == 0 || !strings.HasPrefix(auth[0], "Basic ") {
		t.Fatalf("the registry saw no basic auth: %q", auth)
	}
	_, _, err = c.Push(context.Background(), "other", "tag", []Blob{blob}, []byte("{}"))
	msg, _ := errdefs.PublicMessage(err)
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(msg, "DENIED requested access?to the ?resource is denied") {
		t.Fatalf("push refused by the registry: %v (public %q)", err, msg)
	}
}

func TestParseManifest(t *testing.T) {
	d := "sha256:" + strings.Repeat("a", 64)
	good := `{"schemaVersion":2,"mediaType":"` + MediaTypeManifest + `","config":{"mediaType":"` + MediaTypeConfig + `","digest":"` + d + `","size":2},"layers":[{"mediaType":"` + MediaTypeLayer + `","digest":"` + d + `","size":3}]}`
	m, err := ParseManifest([]byte(good))
	if err != nil || len(m.Layers) != 1 || m.Layers[0].Size != 3 {
		t.Fatalf("ParseManifest(good) = %+v, %v", m, err)
	}
	for _, bad := range []string{
		`{}`, `[]`, `{"schemaVersion":1}`,
		strings.Replace(good, MediaTypeManifest, "application/vnd.docker.distribution.manifest.list.v2+json", 1),
		strings.Replace(good, `"size":3`, `"size":-1`, 1),
		strings.Replace(good, d, "sha256:zz", 1),
	} {
		if _, err := ParseManifest([]byte(bad)); err == nil {
			t.Errorf("ParseManifest(%s) accepted it", bad)
		}
	}
}

// FuzzParseManifest holds that a registry's manifest never panics the
// decoder, and that what it accepts has valid descriptors.
func FuzzParseManifest(f *testing.F) {
	d := "sha256:" + strings.Repeat("a", 64)
	f.Add([]byte(`{"schemaVersion":2,"config":{"digest":"` + d + `","size":2},"layers":[{"digest":"` + d + `","size":3}]}`))
	f.Add([]byte(`{"schemaVersion":2,"layers":null}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest(data)
		if err != nil {
			return
		}
		if len(m.Layers) > maxLayers || !digestPattern.MatchString(m.Config.Digest) {
			t.Fatalf("accepted %+v", m)
		}
		for _, l := range m.Layers {
			if l.Size < 0 || !digestPattern.MatchString(l.Digest) {
				t.Fatalf("accepted layer %+v", l)
			}
		}
	})
}

// FuzzParseErrors holds that a registry's error body never panics the
// decoder nor gives messages with control characters or over the bounds.
func FuzzParseErrors(f *testing.F) {
	f.Add([]byte(`{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}`))
	f.Add([]byte(`{"errors":[{"code":"X","message":"a\nb\u0085"}]}`))
	f.Add([]byte(`{"errors":null}`))
	f.Add([]byte(`{"errors":[{"code":"X","message":"evil\u202etxt.exe\u2028next"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		out := ParseErrors(data)
		if len(out) > maxErrors {
			t.Fatalf("%d messages", len(out))
		}
		for _, s := range out {
			if len(s) > 204 || strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
				t.Fatalf("message %q", s)
			}
		}
	})
}
