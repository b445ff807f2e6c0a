package wheel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"golang.org/x/net/html"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/templates"
)

// maxIndexPageBytes bounds a project's page on a simple index.
const maxIndexPageBytes = 16 << 20

// hexSHA256 is a declaration's pin.
var hexSHA256 = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// Fetch returns the path of the wheel w declares, verified, in cacheDir:
// copied from the operator's wheelhouse directory when w.File is set, or
// downloaded from the PEP 503 simple index at index when w.Name
// ("project==version") is, choosing the version's pure-python wheel
// (py3-none-any or py2.py3-none-any; among several, the one whose hash the
// index says is w.SHA256). The wheel's SHA-256 is checked against w.SHA256
// before the file is put where Fetch's caller, or anything else, reads
// it. cacheDir is keyed by hash (cacheDir/<sha256>/<file>): a wheel
// already there is not fetched again.
//
// Errors are public and name the declaration: an unknown file or
// project, no pure-python wheel of the version, a hash that differs.
func Fetch(ctx context.Context, w templates.Wheel, wheelhouse, index, cacheDir string) (string, error) {
	what := describe(w.File, w.Name)
	if !hexSHA256.MatchString(w.SHA256) {
		return "", errdefs.Publicf("python_wheels: %q: sha256 %q is not 64 hex digits: %w", what, w.SHA256, errdefs.ErrInvalidArgument)
	}
	want := strings.ToLower(w.SHA256)
	if cacheDir == "" {
		return "", fmt.Errorf("fetching wheel %q: no cache directory: %w", what, errdefs.ErrInvalidArgument)
	}
	switch {
	case w.File != "" && w.Name != "":
		return "", errdefs.Publicf("python_wheels: %q: a wheel has a file or a name, not both: %w", what, errdefs.ErrInvalidArgument)
	case w.File != "":
		if _, err := parseFileName(w.File); err != nil {
			return "", err
		}
		if cached, ok := lookCache(cacheDir, want, w.File); ok {
			return cached, nil
		}
		if wheelhouse == "" {
			return "", errdefs.Publicf("python_wheels: %q: no wheelhouse directory is configured (template_sources.wheelhouse): %w", what, errdefs.ErrFailedPrecondition)
		}
		f, err := os.Open(filepath.Join(wheelhouse, w.File))
		if errors.Is(err, os.ErrNotExist) {
			return "", errdefs.Publicf("python_wheels: %q: no such file in the wheelhouse: %w", what, errdefs.ErrNotFound)
		}
		if err != nil {
			return "", fmt.Errorf("opening wheel %q in the wheelhouse: %w", what, err)
		}
		defer f.Close()
		if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
			return "", errdefs.Publicf("python_wheels: %q: not a regular file in the wheelhouse: %w", what, errdefs.ErrInvalidArgument)
		}
		return store(f, cacheDir, what, w.File, want)
	case w.Name != "":
		project, version, err := parsePin(w.Name)
		if err != nil {
			return "", err
		}
		if index == "" {
			return "", errdefs.Publicf("python_wheels: %q: no python index is configured (template_sources.python_index): %w", what, errdefs.ErrFailedPrecondition)
		}
		links, err := indexLinks(ctx, index, project, what)
		if err != nil {
			return "", err
		}
		link, err := choose(links, project, version, want, what)
		if err != nil {
			return "", err
		}
		if cached, ok := lookCache(cacheDir, want, link.file); ok {
			return cached, nil
		}
		resp, err := get(ctx, link.url, "*/*", what)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		return store(resp.Body, cacheDir, what, link.file, want)
	default:
		return "", errdefs.Publicf("python_wheels: a wheel needs a file or a name: %w", errdefs.ErrInvalidArgument)
	}
}

// lookCache returns a cached wheel whose content still has its hash.
func lookCache(cacheDir, sum, file string) (string, bool) {
	p := filepath.Join(cacheDir, sum, file)
	f, err := os.Open(p)
	if err != nil {
		return "", false
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, maxWheelBytes+1)); err != nil || hex.EncodeToString(h.Sum(nil)) != sum {
		return "", false
	}
	return p, true
}

// store copies a wheel into the cache, checking its size and hash before
// it takes its name there.
func store(r io.Reader, cacheDir, what, file, want string) (string, error) {
	dir := filepath.Join(cacheDir, want)
	if err := os.MkdirAll(dir, fsmode.Dir); err != nil {
		return "", fmt.Errorf("making the wheel cache: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".fetch-*")
	if err != nil {
		return "", fmt.Errorf("making the wheel cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, maxWheelBytes+1))
	if err != nil {
		return "", fmt.Errorf("fetching wheel %q: %w", what, err)
	}
	if n > maxWheelBytes {
		return "", errdefs.Publicf("python_wheels: %q: larger than %d MiB: %w", what, maxWheelBytes>>20, errdefs.ErrTooLarge)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return "", hashMismatch(what, got, want)
	}
	if err := tmp.Chmod(fsmode.File); err != nil {
		return "", fmt.Errorf("writing the wheel cache: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("writing the wheel cache: %w", err)
	}
	p := filepath.Join(dir, file)
	if err := os.Rename(tmp.Name(), p); err != nil {
		return "", fmt.Errorf("writing the wheel cache: %w", err)
	}
	return p, nil
}

// link is a file a project's page on a simple index lists.
type link struct {
	file   string
	url    string
	sha256 string // from the link's #sha256= fragment or the JSON's hashes; may be empty
}

// get GETs u, answering errors that name the declaration. The caller
// closes the response's body.
func get(ctx context.Context, u, accept, what string) (*http.Response, error) {
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") {
		return nil, errdefs.Publicf("python_wheels: %q: the index links to a URL that is not http(s): %w", what, errdefs.ErrInvalidArgument)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("fetching wheel %q: %w", what, err)
	}
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetching wheel %q from the python index: %w: %w", what, err, errdefs.ErrUnavailable)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		return nil, errdefs.Publicf("python_wheels: %q: not on the python index: %w", what, errdefs.ErrNotFound)
	case resp.StatusCode != http.StatusOK:
		resp.Body.Close()
		return nil, errdefs.Publicf("python_wheels: %q: the python index answers %s: %w", what, resp.Status, errdefs.ErrUnavailable)
	}
	return resp, nil
}

// indexLinks reads a project's page of a simple index: PEP 691's JSON
// when the index serves it, else PEP 503's HTML.
func indexLinks(ctx context.Context, index, project, what string) ([]link, error) {
	page := strings.TrimSuffix(index, "/") + "/" + normalize(project) + "/"
	resp, err := get(ctx, page, "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1", what)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxIndexPageBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the python index's page of %q: %w: %w", what, err, errdefs.ErrUnavailable)
	}
	if len(b) > maxIndexPageBytes {
		return nil, errdefs.Publicf("python_wheels: %q: the index's page is larger than %d MiB: %w", what, maxIndexPageBytes>>20, errdefs.ErrTooLarge)
	}
	base := resp.Request.URL // relative links resolve against the page, after redirects
	var links []link
	if isJSON(b) {
		links, err = parseJSONPage(b, base)
	} else {
		links, err = parseHTMLPage(b, base)
	}
	if err != nil {
		return nil, errdefs.Publicf("python_wheels: %q: the index's page cannot be read: %w", what, errdefs.ErrUnavailable)
	}
	return links, nil
}

// isJSON tells PEP 691's JSON page from PEP 503's HTML one by its first
// byte: the Content-Type an index sends is not always the one it means.
func isJSON(b []byte) bool {
	s := strings.TrimLeft(string(b[:min(len(b), 512)]), " \t\r\n")
	return strings.HasPrefix(s, "{")
}

// parseJSONPage parses PEP 691's project page.
func parseJSONPage(b []byte, base *url.URL) ([]link, error) {
	var page struct {
		Files []struct {
			Filename string            `json:"filename"`
			URL      string            `json:"url"`
			Hashes   map[string]string `json:"hashes"`
		} `json:"files"`
	}
	if err := json.Unmarshal(b, &page); err != nil {
		return nil, err
	}
	var links []link
	for _, f := range page.Files {
		u, err := base.Parse(f.URL)
		if err != nil {
			continue
		}
		links = append(links, link{file: f.Filename, url: u.String(), sha256: strings.ToLower(f.Hashes["sha256"])})
	}
	return links, nil
}

// parseHTMLPage parses PEP 503's project page: every anchor's text is a
// file name, its href the file's URL with an optional #sha256= fragment.
func parseHTMLPage(b []byte, base *url.URL) ([]link, error) {
	z := html.NewTokenizer(strings.NewReader(string(b)))
	var links []link
	href := ""
	inA := false
	var text strings.Builder
	for {
		switch z.Next() {
		case html.ErrorToken:
			if z.Err() == io.EOF {
				return links, nil
			}
			return nil, z.Err()
		case html.StartTagToken:
			name, hasAttr := z.TagName()
			if string(name) == "base" && hasAttr {
				for {
					k, v, more := z.TagAttr()
					if string(k) == "href" {
						if u, err := base.Parse(string(v)); err == nil {
							base = u
						}
					}
					if !more {
						break
					}
				}
			}
			if string(name) != "a" {
				continue
			}
			inA, href = true, ""
			text.Reset()
			for hasAttr {
				var k, v []byte
				k, v, hasAttr = z.TagAttr()
				if string(k) == "href" {
					href = string(v)
				}
			}
		case html.TextToken:
			if inA && text.Len() < 1024 {
				text.Write(z.Text())
			}
		case html.EndTagToken:
			name, _ := z.TagName()
			if string(name) != "a" || !inA {
				continue
			}
			inA = false
			u, err := base.Parse(href)
			if href == "" || err != nil {
				continue
			}
			l := link{file: strings.TrimSpace(text.String())}
			if algo, sum, ok := strings.Cut(u.Fragment, "="); ok && algo == "sha256" {
				l.sha256 = strings.ToLower(sum)
			}
			u.Fragment = ""
			l.url = u.String()
			links = append(links, l)
		}
	}
}

// choose picks the version's pure-python wheel among an index's links.
func choose(links []link, project, version, want, what string) (link, error) {
	var pure, platform []link
	for _, l := range links {
		fn, err := parseFileName(l.file)
		if err != nil || normalize(fn.Dist) != normalize(project) || !sameVersion(escapeVersion(fn.Version), escapeVersion(version)) {
			continue
		}
		if fn.Pure() {
			pure = append(pure, l)
		} else {
			platform = append(platform, l)
		}
	}
	if len(pure) == 0 {
		if len(platform) > 0 {
			return link{}, errdefs.Publicf("python_wheels: %q: the index has only wheels built for a platform (%s): only pure-python wheels (py3-none-any) install into a template: %w",
				what, platform[0].file, errdefs.ErrInvalidArgument)
		}
		return link{}, errdefs.Publicf("python_wheels: %q: the index has no wheel of version %s: %w", what, version, errdefs.ErrNotFound)
	}
	sort.Slice(pure, func(i, j int) bool { return pure[i].file < pure[j].file })
	for _, l := range pure {
		if l.sha256 == want {
			return l, nil
		}
	}
	for _, l := range pure {
		if l.sha256 == "" {
			return l, nil // its hash is checked once downloaded
		}
	}
	return link{}, hashMismatch(what+" ("+path.Base(pure[0].file)+")", pure[0].sha256, want)
}
