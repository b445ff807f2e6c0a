package npm_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
)

// fakePkg is one version of a package a fake registry serves.
type fakePkg struct {
	name, version        string
	deps, optional, peer map[string]string
	peerOptional         []string
	os                   []string
	scripts              map[string]string // package.json's scripts
	hasInstallScript     bool              // what the registry's document says
	files                map[string]string // more files of the package, by path under package/
	entries              []tarEntry        // raw entries, after the package's
	badIntegrity         bool
	pjName               string // package.json's name, if not name
	deprecated           string
	sha1Only             bool   // the registry gives a shasum and no integrity
	tarballURL           string // the document's dist.tarball, if not the registry's own
}

// tarEntry is a raw tarball entry.
type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

// tarball makes a gzipped tarball of entries.
func tarball(t testing.TB, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Linkname: e.link}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tarballOf is a package's tarball: package.json, its files, its raw
// entries.
func (p fakePkg) tarball(t testing.TB) []byte {
	name := p.name
	if p.pjName != "" {
		name = p.pjName
	}
	pj, _ := json.Marshal(map[string]any{"name": name, "version": p.version, "dependencies": p.deps, "scripts": p.scripts, "main": "index.js"})
	entries := []tarEntry{{name: "package/package.json", body: string(pj)}}
	if _, ok := p.files["index.js"]; !ok {
		entries = append(entries, tarEntry{name: "package/index.js", body: "module.exports = " + jsString(p.name+"@"+p.version) + ";\n"})
	}
	paths := make([]string, 0, len(p.files))
	for f := range p.files {
		paths = append(paths, f)
	}
	sort.Strings(paths)
	for _, f := range paths {
		entries = append(entries, tarEntry{name: "package/" + f, body: p.files[f]})
	}
	return tarball(t, append(entries, p.entries...))
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// fakeRegistry serves packuments and tarballs of pkgs, as the npm
// registry does, and counts the requests for each path.
type fakeRegistry struct {
	*httptest.Server
	mu       sync.Mutex
	requests map[string]int
}

func newRegistry(t *testing.T, pkgs ...fakePkg) *fakeRegistry {
	t.Helper()
	docs := map[string]map[string]any{}
	tarballs := map[string][]byte{}
	reg := &fakeRegistry{requests: map[string]int{}}
	reg.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reg.mu.Lock()
		reg.requests[r.URL.Path]++
		reg.mu.Unlock()
		if tgz, ok := tarballs[r.URL.Path]; ok {
			w.Write(tgz)
			return
		}
		doc, ok := docs[strings.TrimPrefix(r.URL.Path, "/")]
		if !ok {
			http.Error(w, `{"error":"Not found"}`, http.StatusNotFound)
			return
		}
		if !strings.Contains(r.Header.Get("Accept"), "application/vnd.npm.install-v1+json") {
			http.Error(w, "want the abbreviated document", http.StatusNotAcceptable)
			return
		}
		json.NewEncoder(w).Encode(doc)
	}))
	t.Cleanup(reg.Close)
	for _, p := range pkgs {
		doc, ok := docs[p.name]
		if !ok {
			doc = map[string]any{"name": p.name, "dist-tags": map[string]string{}, "versions": map[string]any{}}
			docs[p.name] = doc
		}
		tgz := p.tarball(t)
		file := strings.ReplaceAll(p.name, "/", "-") + "-" + p.version + ".tgz"
		tarballs["/tarballs/"+file] = tgz
		sum := sha512.Sum512(tgz)
		if p.badIntegrity {
			sum[0] ^= 0xff
		}
		meta := map[string]any{}
		for _, n := range p.peerOptional {
			meta[n] = map[string]bool{"optional": true}
		}
		deps := map[string]string{}
		for n, r := range p.deps {
			deps[n] = r
		}
		for n, r := range p.optional {
			deps[n] = r // npm lists optional dependencies among dependencies too
		}
		tarballURL := reg.URL + "/tarballs/" + file
		if p.tarballURL != "" {
			tarballURL = p.tarballURL
		}
		dist := map[string]string{"tarball": tarballURL, "integrity": "sha512-" + base64.StdEncoding.EncodeToString(sum[:])}
		if p.sha1Only {
			s1 := sha1.Sum(tgz)
			dist = map[string]string{"tarball": dist["tarball"], "shasum": hex.EncodeToString(s1[:])}
		}
		doc["versions"].(map[string]any)[p.version] = map[string]any{
			"name": p.name, "version": p.version,
			"dependencies": deps, "optionalDependencies": p.optional, "peerDependencies": p.peer, "peerDependenciesMeta": meta,
			"os": p.os, "hasInstallScript": p.hasInstallScript, "deprecated": p.deprecated,
			"dist": dist,
		}
		doc["dist-tags"].(map[string]string)["latest"] = p.version // the last one listed
	}
	return reg
}

func (r *fakeRegistry) count(path string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[path]
}
