package wheel

import (
	"net/url"
	"strings"
	"testing"
)

// checkLinks asserts what the page parsers promise of their links: each
// URL is absolute and parses again, a sha256 is lower-case.
func checkLinks(t *testing.T, links []link) {
	t.Helper()
	for _, l := range links {
		u, err := url.Parse(l.url)
		if err != nil || !u.IsAbs() {
			t.Fatalf("link %+v: URL %q is not absolute (%v)", l, l.url, err)
		}
		if l.sha256 != strings.ToLower(l.sha256) {
			t.Fatalf("link %+v: sha256 is not lower-case", l)
		}
	}
}

// FuzzParseJSONPage feeds PEP 691 project pages, as an index sends them,
// to parseJSONPage.
func FuzzParseJSONPage(f *testing.F) {
	f.Add([]byte(`{"meta": {"api-version": "1.0"}, "name": "tiny", "files": [{"filename": "tiny-1.0-py3-none-any.whl", "url": "../../files/tiny-1.0-py3-none-any.whl", "hashes": {"sha256": "ABCDEF"}}]}`))
	f.Add([]byte(`{"files": [{"filename": "x", "url": "https://files.example/x"}, {"url": "%zz"}, {"url": "//other/y"}]}`))
	f.Add([]byte(`{"files": null}`))
	f.Add([]byte(`[]`))
	base, err := url.Parse("https://index.example/simple/tiny/")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		links, err := parseJSONPage(b, base)
		if err != nil {
			return
		}
		checkLinks(t, links)
	})
}

// FuzzParseHTMLPage feeds PEP 503 project pages to parseHTMLPage.
func FuzzParseHTMLPage(f *testing.F) {
	f.Add([]byte(`<!DOCTYPE html><html><body><a href="../../files/tiny-1.0-py3-none-any.whl#sha256=ABCDEF">tiny-1.0-py3-none-any.whl</a><br/></body></html>`))
	f.Add([]byte(`<base href="https://mirror.example/p/"><a href="x.whl">x.whl</a><a>no href</a><a href="%zz">bad</a>`))
	f.Add([]byte(`<a href="javascript:alert(1)">` + strings.Repeat("y", 2000) + `</a>`))
	f.Add([]byte(`<a href="x"><a href="y">nested</a>`))
	base, err := url.Parse("https://index.example/simple/tiny/")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		links, err := parseHTMLPage(b, base)
		if err != nil {
			return
		}
		checkLinks(t, links)
		for _, l := range links {
			if strings.Contains(l.url, "#") {
				t.Fatalf("link %+v keeps its fragment", l)
			}
		}
	})
}
