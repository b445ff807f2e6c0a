// Package registry pushes images to a registry that speaks the OCI
// distribution API (Debian's docker-registry, Harbor, a cloud's registry),
// and parses its manifests and error bodies: what `stockade image push`
// and the kubernetes driver need, and no more.
//
// The few HTTP calls are written here by hand rather than taken from
// github.com/google/go-containerregistry: the project keeps few
// dependencies, and a push of one-layer images by digest is six
// requests (HEAD and upload each blob, HEAD and PUT the manifest); the
// library would bring its own image model, keychains and transports for
// what this package does in a few hundred lines.
//
// Authentication: none, or HTTP basic auth (Options.Username and
// Password), sent only over https or to a loopback address. Registries
// that want a bearer token from a token service (Docker Hub, GHCR) are
// not supported yet.
package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// Media types of the images this package pushes.
const (
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// MaxManifestSize bounds a manifest read from a registry (the
// distribution spec's own bound is 4 MiB).
const MaxManifestSize = 4 << 20

// maxErrorBody bounds the error body of a registry's answer that is read.
const maxErrorBody = 64 << 10

var (
	// pathComponent is one component of a repository name (the
	// distribution spec's grammar).
	pathComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	// tagPattern is a tag.
	tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)
	// digestPattern is a sha256 digest.
	digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	// hostPattern is a registry host, with an optional port.
	hostPattern = regexp.MustCompile(`^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$`)
)

// Location is where images go: a registry host and a repository prefix.
type Location struct {
	// Host is the registry's host[:port], as an image reference names it.
	Host string
	// Prefix is the repository path the images go under ("" or
	// "team/stockade"), without slashes at either end.
	Prefix string
	// Scheme is "https", or "http" where the registry was named with
	// http:// (ParseLocation allows it for loopback only, unless
	// insecure).
	Scheme string
}

// ParseLocation parses REGISTRY[/PREFIX], e.g. "registry.example:5000/
// stockade" (https), "http://127.0.0.1:5000" or, with insecure,
// "http://10.0.0.1:5000/stockade". Plain http is refused for a host that
// is not loopback unless insecure: basic auth would go in the clear, and
// anyone on the path could swap the layers (the kubelet pulls by digest
// and would refuse them, but `image push` would not notice).
func ParseLocation(s string, insecure bool) (Location, error) {
	bad := func(format string, a ...any) (Location, error) {
		return Location{}, errdefs.Publicf("registry %q: %s: %w", s, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	loc := Location{Scheme: "https"}
	rest := s
	if r, ok := strings.CutPrefix(s, "https://"); ok {
		rest = r
	} else if r, ok := strings.CutPrefix(s, "http://"); ok {
		rest, loc.Scheme = r, "http"
	} else if strings.Contains(s, "://") {
		return bad("want https:// or http://")
	}
	rest = strings.TrimSuffix(rest, "/")
	host, prefix, _ := strings.Cut(rest, "/")
	if !hostPattern.MatchString(host) {
		return bad("%q is not a host[:port]", host)
	}
	loc.Host = host
	if prefix != "" {
		for _, c := range strings.Split(prefix, "/") {
			if !pathComponent.MatchString(c) {
				return bad("repository path component %q is not lowercase letters and digits, with . _ - between", c)
			}
		}
		loc.Prefix = prefix
	}
	if loc.Scheme == "http" && !insecure && !loopback(loc.Host) {
		return bad("plain http to a host that is not loopback; use https, or --insecure on a network you trust")
	}
	return loc, nil
}

// ParseReference parses REGISTRY[/PREFIX] as an image reference names a
// registry (kubernetes.registry): host[:port][/prefix], with no scheme
// (whether a node pulls over http is its containerd's configuration),
// in ParseLocation's grammar. The scheme of the Location is "https".
func ParseReference(s string) (Location, error) {
	if strings.Contains(s, "://") {
		return Location{}, errdefs.Publicf("registry %q names a scheme; want host[:port][/prefix], as an image reference has it: %w", s, errdefs.ErrInvalidArgument)
	}
	return ParseLocation(s, false)
}

// Ref is the reference of a repository's image by digest, as a kubelet
// pulls it: host/prefix/name@sha256:...
func (l Location) Ref(name, digest string) string { return l.Repo(name) + "@" + digest }

// Repo is the repository of name with the host: host/prefix/name.
func (l Location) Repo(name string) string { return l.Host + "/" + l.path(name) }

// path is the repository of name without the host.
func (l Location) path(name string) string {
	if l.Prefix == "" {
		return name
	}
	return l.Prefix + "/" + name
}

// loopback tells whether host ("name" or "name:port") is this machine's:
// localhost or a loopback address.
func loopback(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ValidName reports why name cannot be a repository name component, or
// nil.
func ValidName(name string) error {
	if !pathComponent.MatchString(name) {
		return errdefs.Publicf("%q cannot name a repository (lowercase letters and digits, with . _ - between): %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Options configure a Client.
type Options struct {
	// Username and Password, if set, are sent as HTTP basic auth.
	Username, Password string
	// HTTP is the client; nil means one with a 30 s response header
	// timeout and no overall timeout (a layer may take minutes). New
	// uses a copy whose CheckRedirect also refuses a redirect to another
	// scheme or host (the credentials would follow it).
	HTTP *http.Client
}

// Client talks to the registry of a Location.
type Client struct {
	loc  Location
	opts Options
	http *http.Client
}

// New returns a client of loc's registry. Basic auth is refused over
// plain http to a host that is not loopback.
func New(loc Location, opts Options) (*Client, error) {
	if opts.Username != "" && loc.Scheme == "http" && !loopback(loc.Host) {
		return nil, errdefs.Publicf("registry %s: refusing to send a password over plain http: %w", loc.Host, errdefs.ErrInvalidArgument)
	}
	c := &Client{loc: loc, opts: opts}
	if opts.HTTP != nil {
		hc := *opts.HTTP
		c.http = &hc
	} else {
		c.http = &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: 30 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second, IdleConnTimeout: 30 * time.Second,
		}}
	}
	c.http.CheckRedirect = sameOrigin(c.http.CheckRedirect)
	return c, nil
}

// sameOrigin is a CheckRedirect that refuses a redirect to another scheme
// or host[:port], then asks next (nil: Go's default, at most 10). Go
// copies the Authorization header to the same host or a subdomain
// whatever the scheme and port, so an https registry (or a TLS proxy in
// front of it) redirecting to http:// would send the password in the
// clear. The calls of this package need no redirect elsewhere: it never
// GETs a blob, the one call registries send to other storage.
func sameOrigin(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if from := via[0].URL; req.URL.Scheme != from.Scheme || req.URL.Host != from.Host {
			return fmt.Errorf("refusing a redirect from %s://%s to another scheme or host, %s://%s: %w", from.Scheme, from.Host, req.URL.Scheme, req.URL.Host, errRedirect)
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
}

// errRedirect marks a redirect sameOrigin refused: the registry's
// configuration (or the address it was named by), which no retry mends.
var errRedirect = errors.New("redirect refused")

// Blob is one blob of an image: its digest and size, and what writes its
// bytes (called only when the registry lacks it, and then once).
type Blob struct {
	Digest string
	Size   int64
	Write  func(io.Writer) error
}

// Stats say what a Push did.
type Stats struct {
	// Uploaded is how many blobs were uploaded, of Blobs; UploadedBytes
	// their size.
	Uploaded, Blobs int
	UploadedBytes   int64
	// ManifestPut tells whether the manifest was put (false: the tag
	// already named it).
	ManifestPut bool
}

// Push puts an image in the repository name of the location: each blob
// the registry lacks (asked with HEAD first, so that a second push
// uploads nothing), then the manifest under tag, unless the tag already
// names it. It returns the manifest's digest, which it checks against the
// registry's.
func (c *Client) Push(ctx context.Context, name, tag string, blobs []Blob, manifest []byte) (string, Stats, error) {
	var st Stats
	if err := ValidName(name); err != nil {
		return "", st, err
	}
	if !tagPattern.MatchString(tag) {
		return "", st, fmt.Errorf("tag %q is malformed: %w", tag, errdefs.ErrInvalidArgument)
	}
	sum := sha256.Sum256(manifest)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	repo := c.loc.path(name)
	for _, b := range blobs {
		st.Blobs++
		if !digestPattern.MatchString(b.Digest) {
			return "", st, fmt.Errorf("blob digest %q is not sha256:<hex>: %w", b.Digest, errdefs.ErrInvalidArgument)
		}
		ok, err := c.blobExists(ctx, repo, b.Digest)
		if err != nil {
			return "", st, err
		}
		if ok {
			continue
		}
		if err := c.upload(ctx, repo, b); err != nil {
			return "", st, err
		}
		st.Uploaded++
		st.UploadedBytes += b.Size
	}
	have, err := c.manifestDigest(ctx, repo, tag)
	if err != nil {
		return "", st, err
	}
	if have == digest {
		return digest, st, nil
	}
	req, err := c.request(ctx, http.MethodPut, c.url("/v2/"+repo+"/manifests/"+tag), bytes.NewReader(manifest))
	if err != nil {
		return "", st, err
	}
	req.ContentLength = int64(len(manifest))
	req.Header.Set("Content-Type", MediaTypeManifest)
	resp, err := c.do(req)
	if err != nil {
		return "", st, err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusCreated {
		return "", st, answerError("putting the manifest of "+repo, resp)
	}
	if got := resp.Header.Get("Docker-Content-Digest"); got != "" && got != digest {
		return "", st, fmt.Errorf("registry %s stored the manifest of %s as %s, not %s: %w", c.loc.Host, repo, got, digest, errdefs.ErrUnavailable)
	}
	st.ManifestPut = true
	return digest, st, nil
}

// blobExists asks the registry whether repo has the blob digest.
func (c *Client) blobExists(ctx context.Context, repo, digest string) (bool, error) {
	req, err := c.request(ctx, http.MethodHead, c.url("/v2/"+repo+"/blobs/"+digest), nil)
	if err != nil {
		return false, err
	}
	resp, err := c.do(req)
	if err != nil {
		return false, err
	}
	defer drain(resp)
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusNotFound:
		return false, nil
	}
	return false, answerError("asking for blob "+digest+" of "+repo, resp)
}

// manifestDigest is the digest of the manifest repo's ref names (""
// where the registry sends none), or notFound if it has none.
func (c *Client) manifestDigest(ctx context.Context, repo, ref string) (string, error) {
	resp, err := c.manifest(ctx, http.MethodHead, repo, ref)
	if err != nil {
		return "", err
	}
	defer drain(resp)
	switch resp.StatusCode {
	case http.StatusOK:
		return resp.Header.Get("Docker-Content-Digest"), nil
	case http.StatusNotFound:
		return notFound, nil
	}
	return "", answerError("asking for manifest "+repo+":"+ref, resp)
}

// Resolve returns the digest of the manifest that tag names in the
// repository name of the location, from one HEAD (the registry's
// Docker-Content-Digest), or, where the registry sends no digest, one GET
// of the manifest, which it hashes. A tag the registry lacks is
// ErrNotFound; a registry that cannot be reached is ErrUnavailable.
func (c *Client) Resolve(ctx context.Context, name, tag string) (string, error) {
	if err := ValidName(name); err != nil {
		return "", err
	}
	if !tagPattern.MatchString(tag) {
		return "", fmt.Errorf("tag %q is malformed: %w", tag, errdefs.ErrInvalidArgument)
	}
	repo := c.loc.path(name)
	digest, err := c.manifestDigest(ctx, repo, tag)
	if err != nil {
		return "", err
	}
	if digest == notFound {
		return "", errdefs.Publicf("registry %s has no manifest %s:%s: %w", c.loc.Host, repo, tag, errdefs.ErrNotFound)
	}
	if digest != "" {
		if !digestPattern.MatchString(digest) {
			return "", fmt.Errorf("registry %s answered the manifest %s:%s with digest %q, not sha256:<hex>: %w", c.loc.Host, repo, tag, digest, errdefs.ErrUnavailable)
		}
		return digest, nil
	}
	resp, err := c.manifest(ctx, http.MethodGet, repo, tag)
	if err != nil {
		return "", err
	}
	defer drain(resp)
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return "", errdefs.Publicf("registry %s has no manifest %s:%s: %w", c.loc.Host, repo, tag, errdefs.ErrNotFound)
	default:
		return "", answerError("getting manifest "+repo+":"+tag, resp)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxManifestSize+1))
	if err != nil {
		return "", fmt.Errorf("registry %s: reading manifest %s:%s: %v: %w", c.loc.Host, repo, tag, err, errdefs.ErrUnavailable)
	}
	if len(body) > MaxManifestSize {
		return "", fmt.Errorf("registry %s: manifest %s:%s is over %d bytes: %w", c.loc.Host, repo, tag, MaxManifestSize, errdefs.ErrUnavailable)
	}
	sum := sha256.Sum256(body)
	got := "sha256:" + hex.EncodeToString(sum[:])
	if d := resp.Header.Get("Docker-Content-Digest"); d != "" && d != got {
		return "", fmt.Errorf("registry %s sent manifest %s:%s as %s, but its bytes hash to %s: %w", c.loc.Host, repo, tag, d, got, errdefs.ErrUnavailable)
	}
	return got, nil
}

// manifest sends a HEAD or GET of the manifest repo's ref names, accepting
// an OCI image manifest; the caller drains the answer.
func (c *Client) manifest(ctx context.Context, method, repo, ref string) (*http.Response, error) {
	req, err := c.request(ctx, method, c.url("/v2/"+repo+"/manifests/"+ref), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", MediaTypeManifest)
	return c.do(req)
}

// notFound is what manifestDigest returns for a manifest the registry
// lacks, where Push wants "" (nothing to compare).
const notFound = "-"

// upload puts blob b in repo: POST for an upload session, then one PUT
// of the whole blob with its digest (the registry checks it).
func (c *Client) upload(ctx context.Context, repo string, b Blob) error {
	req, err := c.request(ctx, http.MethodPost, c.url("/v2/"+repo+"/blobs/uploads/"), nil)
	if err != nil {
		return err
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusAccepted {
		defer drain(resp)
		return answerError("starting the upload of "+b.Digest+" to "+repo, resp)
	}
	drain(resp)
	u, err := c.uploadURL(resp.Header.Get("Location"))
	if err != nil {
		return err
	}
	q := u.Query()
	q.Set("digest", b.Digest)
	u.RawQuery = q.Encode()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(b.Write(pw)) }()
	defer pr.Close()
	req, err = c.request(ctx, http.MethodPut, u.String(), pr)
	if err != nil {
		return err
	}
	req.ContentLength = b.Size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err = c.do(req)
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusCreated {
		return answerError("uploading "+b.Digest+" to "+repo, resp)
	}
	return nil
}

// uploadURL resolves an upload session's Location against the registry,
// refusing one on another host (the credentials would follow it).
func (c *Client) uploadURL(loc string) (*url.URL, error) {
	base, _ := url.Parse(c.url("/"))
	u, err := base.Parse(loc)
	if err != nil || loc == "" {
		return nil, fmt.Errorf("registry %s gave an upload location %q that is not a URL: %w", c.loc.Host, loc, errdefs.ErrUnavailable)
	}
	if u.Scheme != base.Scheme || u.Host != base.Host {
		return nil, fmt.Errorf("registry %s gave an upload location on another host (%s://%s): %w", c.loc.Host, u.Scheme, u.Host, errdefs.ErrUnavailable)
	}
	return u, nil
}

// url is the registry's URL of path.
func (c *Client) url(path string) string { return c.loc.Scheme + "://" + c.loc.Host + path }

// request builds a request with the client's credentials.
func (c *Client) request(ctx context.Context, method, u string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("registry request: %w", err)
	}
	if c.opts.Username != "" {
		req.SetBasicAuth(c.opts.Username, c.opts.Password)
	}
	return req, nil
}

// do sends req, classing a failure to reach the registry.
func (c *Client) do(req *http.Request) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		if req.Context().Err() != nil {
			return nil, req.Context().Err()
		}
		if errors.Is(err, errRedirect) {
			return nil, errdefs.Publicf("registry %s: %v: %w", c.loc.Host, err, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("registry %s: %v: %w", c.loc.Host, err, errdefs.ErrUnavailable)
	}
	return resp, nil
}

// drain reads a little of resp's body, so the connection can be reused,
// and closes it.
func drain(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
}

// answerError is the error of a registry's unexpected answer to what,
// classed by its status, with the registry's own error messages.
func answerError(what string, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	msg := resp.Status
	if errs := ParseErrors(body); len(errs) > 0 {
		msg += ": " + strings.Join(errs, "; ")
	}
	class := errdefs.ErrUnavailable
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		class = errdefs.ErrUnauthenticated
		if strings.HasPrefix(strings.ToLower(resp.Header.Get("WWW-Authenticate")), "bearer") {
			msg += " (the registry wants a bearer token, which stockade does not fetch yet: use a registry with basic auth or none)"
		}
	case http.StatusForbidden:
		class = errdefs.ErrPermissionDenied
	case http.StatusNotFound:
		class = errdefs.ErrNotFound
	case http.StatusBadRequest:
		class = errdefs.ErrInvalidArgument
	}
	return errdefs.Publicf("registry: %s: %s: %w", what, msg, class)
}
