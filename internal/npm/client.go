package npm

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// What the host fetches: the registry's documents and the tarballs they
// name, from the registry's origin only. A document naming a tarball
// elsewhere is refused (a registry, or a document on it, must not make
// the host fetch from a host the operator never named), and a redirect
// that leaves the origin is not followed.
//
// The client connects directly: it reads no proxy from the environment
// (packages never read the environment; docs/design.md). An operator
// behind a proxy points template_sources.npm_registry at a registry
// mirror that is reachable.

// Timeouts of the registry client.
const (
	// fetchTimeout bounds one request, its body read included: a tarball
	// of maxTarballBytes on a slow link.
	fetchTimeout = 10 * time.Minute
	// maxRedirects bounds the redirects of one request.
	maxRedirects = 5
)

// client fetches from the registry, as the package documents.
var client = &http.Client{
	Transport: &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          32,
		MaxIdleConnsPerHost:   fetchers,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		ExpectContinueTimeout: time.Second,
	},
	Timeout:       fetchTimeout,
	CheckRedirect: sameOriginRedirect,
}

// sameOriginRedirect follows a redirect that stays on the first request's
// origin, at most maxRedirects of them.
func sameOriginRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("more than %d redirects", maxRedirects)
	}
	if !sameOrigin(req.URL, via[0].URL) {
		return fmt.Errorf("redirected from %s to another origin, %s", origin(via[0].URL), origin(req.URL))
	}
	return nil
}

// errOtherOrigin is a URL that is not on the registry's origin.
var errOtherOrigin = errors.New("not on the registry's origin")

// checkOrigin returns errOtherOrigin unless raw is an http(s) URL on the
// origin of registry.
func checkOrigin(raw, registry string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("not an http(s) URL")
	}
	r, err := url.Parse(registry)
	if err != nil || !sameOrigin(u, r) {
		return errOtherOrigin
	}
	return nil
}

// sameOrigin reports whether a and b have the same scheme, host and port
// (a missing port being the scheme's).
func sameOrigin(a, b *url.URL) bool {
	return origin(a) == origin(b)
}

// origin is u's "scheme://host:port", lower-cased, with the scheme's
// default port when u names none.
func origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// tarballURLError is the public error of a package whose tarball URL
// checkOrigin refused; spec, if set, is the template's spec that led to
// it.
func tarballURLError(spec string, p Package, registry string, err error) error {
	prefix := "npm_packages: "
	if spec != "" {
		prefix += fmt.Sprintf("%q: ", spec)
	}
	if errors.Is(err, errOtherOrigin) {
		return errdefs.Publicf("%s%s@%s: its tarball URL %q is not on the registry's origin (%s); the host fetches from the registry only: %w",
			prefix, p.Name, p.Version, p.Resolved, registryOrigin(registry), errdefs.ErrInvalidArgument)
	}
	return errdefs.Publicf("%s%s@%s: its tarball URL %q is %s: %w", prefix, p.Name, p.Version, p.Resolved, err.Error(), errdefs.ErrInvalidArgument)
}

// registryOrigin is the origin of the registry URL, for messages.
func registryOrigin(registry string) string {
	u, err := url.Parse(registry)
	if err != nil {
		return registry
	}
	return origin(u)
}
