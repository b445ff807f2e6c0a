package wheel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/wheel"
	"github.com/stockade-sh/stockade/templates"
)

// TestFetchWheelhouse fetches a wheel from a wheelhouse directory into the
// cache, checks its hash, and answers from the cache once it is there.
func TestFetchWheelhouse(t *testing.T) {
	house := t.TempDir()
	_, sum := writeWheel(t, house, "tiny-1.0-py3-none-any.whl", goodEntries())
	cache := t.TempDir()
	ctx := context.Background()

	p, err := wheel.Fetch(ctx, templates.Wheel{File: "tiny-1.0-py3-none-any.whl", SHA256: strings.ToUpper(sum)}, house, "", cache)
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	if want := filepath.Join(cache, sum, "tiny-1.0-py3-none-any.whl"); p != want || fileSHA256(t, p) != sum {
		t.Errorf("Fetch = %s, want %s with the wheel's content", p, want)
	}
	if _, err := wheel.Install(p, newRoot(t), sitePackages); err != nil {
		t.Errorf("installing the fetched wheel: %v", err)
	}

	// Cached: the wheelhouse is no longer read.
	if err := os.Remove(filepath.Join(house, "tiny-1.0-py3-none-any.whl")); err != nil {
		t.Fatal(err)
	}
	if p2, err := wheel.Fetch(ctx, templates.Wheel{File: "tiny-1.0-py3-none-any.whl", SHA256: sum}, house, "", cache); err != nil || p2 != p {
		t.Errorf("Fetch from the cache = %s, %v; want %s", p2, err, p)
	}
}

// TestFetchRefuses checks Fetch's errors: each public, naming the
// declared wheel, and a wheel of the wrong hash never reaching the cache
// under its name.
func TestFetchRefuses(t *testing.T) {
	house := t.TempDir()
	_, sum := writeWheel(t, house, "tiny-1.0-py3-none-any.whl", goodEntries())
	wrong := strings.Repeat("0", 64)
	tests := []struct {
		name  string
		w     templates.Wheel
		index string
		want  string
		class func(error) bool
	}{
		{"wrong hash", templates.Wheel{File: "tiny-1.0-py3-none-any.whl", SHA256: wrong}, "", `python_wheels: "tiny-1.0-py3-none-any.whl": sha256 is ` + sum + ", the declaration pins " + wrong, errdefs.IsInvalidArgument},
		{"missing", templates.Wheel{File: "nope-1.0-py3-none-any.whl", SHA256: sum}, "", `"nope-1.0-py3-none-any.whl": no such file in the wheelhouse`, errdefs.IsNotFound},
		{"bad hash", templates.Wheel{File: "tiny-1.0-py3-none-any.whl", SHA256: "abc"}, "", `sha256 "abc" is not 64 hex digits`, errdefs.IsInvalidArgument},
		{"path in file", templates.Wheel{File: "../tiny-1.0-py3-none-any.whl", SHA256: sum}, "", "not a wheel file name", errdefs.IsInvalidArgument},
		{"both", templates.Wheel{File: "tiny-1.0-py3-none-any.whl", Name: "tiny==1.0", SHA256: sum}, "", "a file or a name, not both", errdefs.IsInvalidArgument},
		{"no index", templates.Wheel{Name: "tiny==1.0", SHA256: sum}, "", "no python index is configured", errdefs.IsFailedPrecondition},
		{"bad pin", templates.Wheel{Name: "tiny>=1.0", SHA256: sum}, "http://127.0.0.1:1", `"tiny>=1.0": want "project==version"`, errdefs.IsInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache := t.TempDir()
			_, err := wheel.Fetch(context.Background(), tt.w, house, tt.index, cache)
			msg, public := errdefs.PublicMessage(err)
			if !public || !strings.Contains(msg, tt.want) || !tt.class(err) {
				t.Errorf("Fetch: %v (public %v), want a public error of its class containing %q", err, public, tt.want)
			}
			if _, err := os.Stat(filepath.Join(cache, wrong, tt.w.File)); err == nil && tt.w.File != "" {
				t.Errorf("a wheel of the wrong hash is in the cache")
			}
		})
	}
}

// index serves a PEP 503 simple index (HTML, or PEP 691 JSON when json
// is set) of the wheels in house, as a real index lists a project's
// files, with a platform wheel beside the pure one. PyPI is not reachable
// from the machines the tests run on, so the index is local.
func index(t *testing.T, house string, json bool) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/simple/tiny/", func(w http.ResponseWriter, r *http.Request) {
		names, _ := filepath.Glob(filepath.Join(house, "*.whl"))
		if json {
			w.Header().Set("Content-Type", "application/vnd.pypi.simple.v1+json")
			var files []string
			for _, n := range names {
				b := filepath.Base(n)
				files = append(files, fmt.Sprintf(`{"filename":%q,"url":"../../files/%s","hashes":{"sha256":%q}}`, b, b, fileSHA256(t, n)))
			}
			fmt.Fprintf(w, `{"meta":{"api-version":"1.0"},"name":"tiny","files":[%s]}`, strings.Join(files, ","))
			return
		}
		fmt.Fprint(w, "<!DOCTYPE html><html><body>\n")
		for _, n := range names {
			b := filepath.Base(n)
			fmt.Fprintf(w, "<a href=\"../../files/%s#sha256=%s\" data-requires-python=\"&gt;=3.8\">%s</a><br/>\n", b, fileSHA256(t, n), b)
		}
		fmt.Fprint(w, "</body></html>\n")
	})
	mux.Handle("/files/", http.StripPrefix("/files/", http.FileServer(http.Dir(house))))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestFetchIndex fetches "tiny==1.0" from a simple index, HTML and JSON,
// choosing the pure-python wheel over the platform one.
func TestFetchIndex(t *testing.T) {
	house := t.TempDir()
	_, sum := writeWheel(t, house, "tiny-1.0-py3-none-any.whl", goodEntries())
	writeWheel(t, house, "tiny-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", goodEntries())
	writeWheel(t, house, "tiny-0.9-py3-none-any.whl", goodEntries())
	for _, json := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", json), func(t *testing.T) {
			srv := index(t, house, json)
			cache := t.TempDir()
			p, err := wheel.Fetch(context.Background(), templates.Wheel{Name: "Tiny==1.0", SHA256: sum}, "", srv.URL+"/simple", cache)
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			if filepath.Base(p) != "tiny-1.0-py3-none-any.whl" || fileSHA256(t, p) != sum {
				t.Errorf("Fetch = %s, want the pure wheel with sha256 %s", p, sum)
			}

			_, err = wheel.Fetch(context.Background(), templates.Wheel{Name: "tiny==2.0", SHA256: sum}, "", srv.URL+"/simple/", cache)
			if msg, _ := errdefs.PublicMessage(err); !strings.Contains(msg, `"tiny==2.0": the index has no wheel of version 2.0`) || !errdefs.IsNotFound(err) {
				t.Errorf("Fetch of a missing version: %v", err)
			}
			_, err = wheel.Fetch(context.Background(), templates.Wheel{Name: "absent==1.0", SHA256: sum}, "", srv.URL+"/simple/", cache)
			if msg, _ := errdefs.PublicMessage(err); !strings.Contains(msg, `"absent==1.0": not on the python index`) {
				t.Errorf("Fetch of a missing project: %v", err)
			}
			_, err = wheel.Fetch(context.Background(), templates.Wheel{Name: "tiny==1.0", SHA256: strings.Repeat("1", 64)}, "", srv.URL+"/simple/", cache)
			if msg, _ := errdefs.PublicMessage(err); !strings.Contains(msg, "sha256 is "+sum) {
				t.Errorf("Fetch with the wrong hash: %v", err)
			}
		})
	}

	// Only a platform wheel of the version.
	plat := t.TempDir()
	writeWheel(t, plat, "tiny-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", goodEntries())
	srv := index(t, plat, false)
	_, err := wheel.Fetch(context.Background(), templates.Wheel{Name: "tiny==1.0", SHA256: sum}, "", srv.URL+"/simple", t.TempDir())
	if msg, _ := errdefs.PublicMessage(err); !strings.Contains(msg, "only wheels built for a platform (tiny-1.0-cp311-cp311-manylinux_2_17_x86_64.whl)") {
		t.Errorf("Fetch with only a platform wheel: %v", err)
	}
}
