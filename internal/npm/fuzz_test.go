package npm

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzDecodePackument feeds the registry document decoder arbitrary
// documents: it must not panic, and what it keeps must be consistent
// (every sorted version decodes or fails cleanly, pick answers one of
// them).
func FuzzDecodePackument(f *testing.F) {
	f.Add([]byte(`{"name":"debug","dist-tags":{"latest":"4.3.4"},"versions":{"4.3.4":{"name":"debug","version":"4.3.4","dependencies":{"ms":"2.1.2"},"peerDependenciesMeta":{"supports-color":{"optional":true}},"dist":{"integrity":"sha512-PRWFHuSU3eDtQJPvnNY7Jcket1j0t5OuOsFzPPzsekD52Zl8qUfFIPEiswXqIvHWGVHOgX+7G/vCNNhehwxfkQ==","shasum":"1319f6579357f2338d3337d2cdd4914bb5dcc865","tarball":"https://registry.npmjs.org/debug/-/debug-4.3.4.tgz"}}}}`))
	f.Add([]byte(`{"name":"x","dist-tags":{"latest":7},"versions":{"1.0.0":{"dependencies":[],"os":"linux","bundleDependencies":true},"v1.0.0":{},"01.0.0":{},"1.0.0-rc.1":{"scripts":{"install":null}}}}`))
	f.Add([]byte(`{"versions":{"1.0.0":{"dependencies":{"a":1}}}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodePackument(bytes.NewReader(b), 1<<20)
		if err != nil {
			return
		}
		for i, v := range p.sorted {
			if i > 0 && compare(p.sorted[i-1], v) < 0 {
				t.Fatalf("versions not sorted: %v before %v", p.sorted[i-1], v)
			}
			if m, err := p.manifest(v); err == nil {
				_ = m.platformOK()
				_, _ = integrityOf(m)
			}
		}
		if v, ok := p.pick(semverRange{{{">=", version{}}}}); ok {
			if _, known := p.raw[v.String()]; !known {
				t.Fatalf("pick chose %v, which is not a version of the document", v)
			}
		}
	})
}

// FuzzParseRange feeds the range parser arbitrary ranges: no panic, and a
// parsed range tests versions without one.
func FuzzParseRange(f *testing.F) {
	for _, s := range []string{"^1.2.3", "~1.2", "1.x || >=2.0.0 <3", "1.2.3 - 2", "*", "", ">*", "^0.0.1-beta.2", "latest"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseRange(s)
		if err != nil {
			return
		}
		for _, v := range []version{{}, {Major: 1, Minor: 2, Patch: 3}, {Major: 1, Pre: []string{"0"}}} {
			_ = r.test(v)
		}
	})
}

// FuzzExtract feeds the tarball extractor arbitrary tar archives (gzipped
// here, so that the fuzzer works on tar's structure): it must not panic
// nor write outside the package's directory.
func FuzzExtract(f *testing.F) {
	var good bytes.Buffer
	tw := tar.NewWriter(&good)
	for _, e := range []struct {
		name, body string
		typ        byte
	}{
		{"package/package.json", `{"name":"x","version":"1.0.0"}`, tar.TypeReg},
		{"package/lib/", "", tar.TypeDir},
		{"package/lib/a.js", "1", tar.TypeReg},
		{"package/../escape", "x", tar.TypeReg},
		{"package/link", "", tar.TypeSymlink},
	} {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)), Linkname: "/etc"}
		_ = tw.WriteHeader(h)
		_, _ = tw.Write([]byte(e.body))
	}
	_ = tw.Close()
	f.Add(good.Bytes())
	// One directory per worker process, emptied after each input: cheaper
	// than t.TempDir's, which matters at CI's 20000 inputs.
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		_, _ = zw.Write(b)
		_ = zw.Close()
		root := filepath.Join(base, "root")
		defer os.RemoveAll(root)
		if err := os.MkdirAll(filepath.Join(root, "node_modules", "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		r, err := os.OpenRoot(root)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		x := &extractor{root: r, dir: "node_modules/x", what: "x@1.0.0", budget: 1 << 20}
		_ = x.extract(&gz)
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			if rel != "." && rel != "node_modules" && rel != "node_modules/x" && !strings.HasPrefix(rel, "node_modules/x/") {
				t.Fatalf("extract wrote %s", rel)
			}
			if d.Type()&fs.ModeSymlink != 0 || (!d.IsDir() && !d.Type().IsRegular()) {
				t.Fatalf("extract made %s of type %v", rel, d.Type())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
