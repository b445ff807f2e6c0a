// Package broker is Stockade's credential broker (docs/design.md §7): code
// in a sandbox never holds a secret; it asks the broker, outside the
// sandbox, to perform one of a few named operations that the operator
// configured, and the broker makes the upstream call with the secret and
// hands back the answer without it.
//
// An operation is a method, an upstream URL template, the parameters the
// caller may fill (each validated) and a reference to the credential: an
// environment variable of the daemon or a file, read by the broker at call
// time, never taken from the request. Sandboxes reach the broker at
// http://broker.stockade.internal/v1/ops/{name} through the egress proxy,
// which serves Handler in process for the sandbox's tool; a tool may call
// only the operations its record lists. Every call, allowed or refused, is
// reported to Config.OnAudit with the operation, the SHA-256 of its
// parameters and the upstream status.
//
//	b, err := broker.New(broker.Config{Operations: ops, LookupEnv: os.LookupEnv, OnAudit: audit})
//	pol := egress.Policy{..., Broker: b.Handler(broker.Caller{Sandbox: id, Tool: t.Name, Operations: t.Credentials})}
package broker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/clip"
)

// Credential says where an operation's secret comes from. Exactly one field
// is set.
type Credential struct {
	// Env names a variable of the daemon's environment.
	Env string
	// File is a file holding the secret; one trailing newline is dropped.
	// It is read at every call, so a rotated secret takes effect at once.
	File string
}

// Param is a parameter the caller may give an operation.
type Param struct {
	Name string
	// Pattern is a regular expression the whole value must match; empty
	// means DefaultPattern.
	Pattern string
	// Required parameters must be given.
	Required bool
	// MaxLen bounds the value's length in bytes; zero means 256.
	MaxLen int
}

// DefaultPattern is the pattern of a Param that names none: identifiers,
// numbers and slugs, nothing that could change a URL's structure.
const DefaultPattern = `[A-Za-z0-9][A-Za-z0-9._-]*`

// Operation is one named upstream call.
type Operation struct {
	// Name is what the sandbox calls: /v1/ops/{Name}. Lower-case letters
	// and digits separated by '.', '_' or '-', as in tool records.
	Name string
	// Method is GET, POST, PUT, PATCH or DELETE.
	Method string
	// URL is the upstream URL, http or https, with {param} placeholders in
	// its path only: "https://api.example.com/v1/repos/{repo}/issues".
	// Placeholders are filled path-escaped.
	URL string
	// Params are every parameter the caller may give. Those not in the URL
	// go into the query string, or into a JSON object body when JSONBody is
	// set. Any other parameter is refused.
	Params []Param
	// JSONBody sends the non-path parameters as a JSON object body.
	JSONBody bool
	// Credential is where the secret comes from.
	Credential Credential
	// Header carries the secret upstream; empty means "Authorization".
	// Prefix goes before the secret, e.g. "Bearer ".
	Header string
	Prefix string
	// ResponseHeaders are the upstream response headers the sandbox gets
	// besides Content-Type, which it always gets: "Etag", "Link",
	// "X-RateLimit-Remaining". Every other header is dropped, and so is
	// each value that holds the secret (see redactor). Headers that carry
	// credentials or sessions (Set-Cookie, Authorization,
	// WWW-Authenticate, ...), hop-by-hop headers, Content-Length,
	// Content-Encoding and Header itself may not be listed.
	ResponseHeaders []string
}

// Event is the audit record of one call to the broker.
type Event struct {
	Sandbox   string
	Tool      string
	Operation string
	// ParamsSHA256 is the hex SHA-256 of the parameters as canonical JSON
	// (an object with sorted keys); empty when they could not be read.
	ParamsSHA256 string
	// Allowed is false when the broker refused the call; Reason says why.
	Allowed bool
	Reason  string
	// Status is the upstream's HTTP status; zero when no upstream call was
	// made or it failed.
	Status   int
	Time     time.Time
	Duration time.Duration
}

// Config configures a Broker.
type Config struct {
	Operations []Operation
	// LookupEnv reads the daemon's environment for Credential.Env (the
	// daemon passes os.LookupEnv); nil means no environment, so every
	// Env credential is missing.
	LookupEnv func(string) (string, bool)
	// Client makes the upstream calls; nil means a client with timeouts
	// that uses no proxy and follows no redirect.
	Client *http.Client
	// OnAudit receives one Event per call; called concurrently.
	OnAudit func(Event)
	// Logger receives one line per refused call (Debug: OnAudit gets
	// them all) or failed call (Warn, Error), the first clip.MaxLines of
	// one Handler only, what the sandbox chose cut to a few hundred bytes;
	// nil discards.
	Logger *slog.Logger
	// Timeout bounds one upstream call; zero means 30 s.
	Timeout time.Duration
	// MaxResponseBytes bounds an upstream response body; zero means 8 MiB.
	MaxResponseBytes int64
	// MaxCallsInFlight bounds the calls one sandbox (one Handler) has in
	// flight at a time; zero means 4. Past it a call is refused with 429:
	// each call holds its response in memory (a few times
	// MaxResponseBytes), and every call spends the operator's credential.
	MaxCallsInFlight int
}

// Broker performs configured operations with secrets the sandbox never
// sees. It is safe for concurrent use.
type Broker struct {
	cfg Config
	ops map[string]*op
}

type op struct {
	Operation
	params   map[string]*param
	inPath   map[string]bool
	header   string
	template string
	// passes are the canonical names of the response headers the sandbox
	// gets.
	passes map[string]bool
}

type param struct {
	Param
	re *regexp.Regexp
}

var (
	namePattern        = regexp.MustCompile(`^[a-z][a-z0-9]*([._-][a-z0-9]+)*$`)
	paramNamePattern   = regexp.MustCompile(`^[a-z][a-z0-9_]*$`) // and at most 64 characters
	placeholderPattern = regexp.MustCompile(`\{([^{}]*)\}`)
	headerNamePattern  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,63}$`)
)

// New validates cfg and returns a broker.
func New(cfg Config) (*Broker, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = 8 << 20
	}
	if cfg.MaxCallsInFlight == 0 {
		cfg.MaxCallsInFlight = 4
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Client == nil {
		cfg.Client = defaultClient(cfg.Timeout)
	}
	b := &Broker{cfg: cfg, ops: map[string]*op{}}
	var errs []error
	for _, o := range cfg.Operations {
		c, err := compile(o)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if b.ops[o.Name] != nil {
			errs = append(errs, fmt.Errorf("broker operation %q is defined twice", o.Name))
			continue
		}
		b.ops[o.Name] = c
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// Has reports whether an operation is configured; the daemon checks tool
// records' credential lines with it.
func (b *Broker) Has(name string) bool { return b.ops[name] != nil }

func compile(o Operation) (*op, error) {
	bad := func(format string, a ...any) (*op, error) {
		return nil, fmt.Errorf("broker operation %q: "+format, append([]any{o.Name}, a...)...)
	}
	if len(o.Name) > 64 || !namePattern.MatchString(o.Name) {
		return bad("the name must be lower-case letters and digits separated by '.', '_' or '-'")
	}
	switch o.Method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return bad("method %q is not one of GET, POST, PUT, PATCH, DELETE", o.Method)
	}
	if (o.Credential.Env == "") == (o.Credential.File == "") {
		return bad("set exactly one of credential env and file")
	}
	c := &op{Operation: o, params: map[string]*param{}, inPath: map[string]bool{}, template: o.URL}
	c.header = textproto.CanonicalMIMEHeaderKey(o.Header)
	if c.header == "" {
		c.header = "Authorization"
	}
	if strings.ContainsAny(c.header, " :\r\n") || strings.ContainsAny(o.Prefix, "\r\n") {
		return bad("header %q or prefix is not valid", o.Header)
	}
	c.passes = map[string]bool{"Content-Type": true}
	for _, name := range o.ResponseHeaders {
		k := textproto.CanonicalMIMEHeaderKey(name)
		switch {
		case !headerNamePattern.MatchString(name):
			return bad("response header %q is not a header name", name)
		case unpassable[k] || k == c.header || strings.HasPrefix(k, "X-Stockade-"):
			return bad("response header %s may not pass to the sandbox: it carries credentials, belongs to the connection or is the broker's own", k)
		}
		c.passes[k] = true
	}
	for _, p := range o.Params {
		if len(p.Name) > 64 || !paramNamePattern.MatchString(p.Name) {
			return bad("parameter name %q must be lower-case letters, digits and '_'", p.Name)
		}
		if c.params[p.Name] != nil {
			return bad("parameter %q is listed twice", p.Name)
		}
		pat := p.Pattern
		if pat == "" {
			pat = DefaultPattern
		}
		re, err := regexp.Compile(`^(?:` + pat + `)$`)
		if err != nil {
			return bad("parameter %q: pattern: %v", p.Name, err)
		}
		if p.MaxLen == 0 {
			p.MaxLen = 256
		}
		c.params[p.Name] = &param{Param: p, re: re}
	}
	// Placeholders may only stand in the path: the host, scheme and port
	// are the operator's, never the caller's.
	for _, m := range placeholderPattern.FindAllStringSubmatch(o.URL, -1) {
		if c.params[m[1]] == nil {
			return bad("URL placeholder {%s} is not a listed parameter", m[1])
		}
		c.inPath[m[1]] = true
	}
	u1, err1 := url.Parse(placeholderPattern.ReplaceAllString(o.URL, "a"))
	u2, err2 := url.Parse(placeholderPattern.ReplaceAllString(o.URL, "b"))
	switch {
	case err1 != nil || err2 != nil:
		return bad("URL %q does not parse", o.URL)
	case u1.Scheme != "https" && u1.Scheme != "http":
		return bad("URL %q must be http or https", o.URL)
	case u1.Host == "" || u1.User != nil:
		return bad("URL %q must name a host and no user", o.URL)
	case u1.Host != u2.Host || u1.RawQuery != u2.RawQuery || u1.Fragment != "":
		return bad("URL %q: placeholders may only stand in the path", o.URL)
	}
	return c, nil
}

func defaultClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			// Never the environment's proxy: the broker's own calls go
			// straight to the operator's upstream.
			Proxy:                  nil,
			DialContext:            (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
			TLSHandshakeTimeout:    10 * time.Second,
			ResponseHeaderTimeout:  timeout,
			MaxResponseHeaderBytes: 64 << 10,
			ForceAttemptHTTP2:      true,
		},
		// A redirect would carry the request (and, same-host, the secret)
		// somewhere the operator did not name; the caller gets it instead.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Caller is the sandbox a Handler serves.
type Caller struct {
	Sandbox string
	Tool    string
	// Operations are the broker operations the tool's record lists. Nil
	// means none: every call is refused.
	Operations []string
}

// Handler serves the broker's API for one sandbox:
//
//	GET  /v1/ops/{name}?param=value...
//	POST /v1/ops/{name}   {"param": "value", ...}
//
// The answer is the upstream's status and body, with only Content-Type and
// the headers the operation declares (Operation.ResponseHeaders), and
// every occurrence of the secret found replaced (see redactor). Refusals
// are JSON {"error": ...} with 400, 403, 404 or 502/503.
func (b *Broker) Handler(c Caller) http.Handler {
	c.Operations = slices.Clone(c.Operations)
	inFlight := make(chan struct{}, b.cfg.MaxCallsInFlight)
	lines := &clip.Lines{}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/ops/{name}", func(w http.ResponseWriter, r *http.Request) {
		select {
		case inFlight <- struct{}{}:
			defer func() { <-inFlight }()
			b.serve(w, r, c, lines)
		default:
			b.refuse(w, lines, Event{Sandbox: c.Sandbox, Tool: c.Tool, Operation: r.PathValue("name"), Time: time.Now()}, http.StatusTooManyRequests,
				fmt.Sprintf("%d broker calls of this sandbox are in flight, the most it may have; try again when one has answered", b.cfg.MaxCallsInFlight))
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not found; call /v1/ops/{name}")
	})
	return mux
}

// maxRequestBody bounds the parameters of one call.
const maxRequestBody = 64 << 10

func (b *Broker) serve(w http.ResponseWriter, r *http.Request, c Caller, lines *clip.Lines) {
	start := time.Now()
	ev := Event{Sandbox: c.Sandbox, Tool: c.Tool, Operation: r.PathValue("name"), Time: start}
	refuse := func(status int, reason string) { b.refuse(w, lines, ev, status, reason) }
	params, perr := readParams(r)
	if perr == nil {
		ev.ParamsSHA256 = hashParams(params)
	}
	o := b.ops[ev.Operation]
	switch {
	case !slices.Contains(c.Operations, ev.Operation):
		refuse(http.StatusForbidden, fmt.Sprintf("operation %q is not in tool %q's credentials", ev.Operation, c.Tool))
		return
	case o == nil:
		refuse(http.StatusNotFound, fmt.Sprintf("operation %q is not configured", ev.Operation))
		return
	case perr != nil:
		refuse(http.StatusBadRequest, perr.Error())
		return
	}
	if err := o.check(params); err != nil {
		refuse(http.StatusBadRequest, err.Error())
		return
	}
	secret, err := b.secret(o.Credential)
	if err != nil {
		if lines.Pass() {
			b.cfg.Logger.Error("broker credential unavailable", "operation", o.Name, "err", err)
		}
		refuse(http.StatusServiceUnavailable, "the operation's credential is not available; ask the operator")
		return
	}
	req, err := o.request(r.Context(), params, secret)
	if err != nil {
		refuse(http.StatusBadRequest, err.Error())
		return
	}
	resp, err := b.cfg.Client.Do(req)
	if err != nil {
		// The error may quote the URL; it never holds the secret, which
		// is only in a header, but say little anyway.
		if lines.Pass() {
			b.cfg.Logger.Warn("broker upstream call failed", "sandbox", c.Sandbox, "operation", o.Name, "err", clip.String(err.Error(), clip.Detail))
		}
		refuse(http.StatusBadGateway, "the upstream call failed")
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, b.cfg.MaxResponseBytes+1))
	if err != nil || int64(len(body)) > b.cfg.MaxResponseBytes {
		ev.Status = resp.StatusCode
		refuse(http.StatusBadGateway, "the upstream response was unreadable or too large")
		return
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		// The transport decodes the gzip it asks for; any other encoding
		// would hide the secret from redaction.
		ev.Status = resp.StatusCode
		refuse(http.StatusBadGateway, "the upstream answered in a content encoding ("+clip.String(ce, 64)+") the broker cannot look into")
		return
	}
	red := newRedactor(secret)
	body = red.redact(body)
	h := w.Header()
	for k, vs := range resp.Header {
		if !o.passes[textproto.CanonicalMIMEHeaderKey(k)] {
			continue
		}
		for _, v := range vs {
			if !red.holds(v) {
				h.Add(k, v)
			}
		}
	}
	h.Set("X-Stockade-Broker-Operation", o.Name)
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
	ev.Allowed, ev.Reason, ev.Status, ev.Duration = true, "allowed", resp.StatusCode, time.Since(start)
	b.audit(ev)
}

// unpassable are the upstream response headers an operation may not
// declare: they carry credentials or sessions (which the sandbox must
// never hold), describe the upstream connection rather than the answer, or
// are the broker's own.
var unpassable = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Www-Authenticate": true, "Proxy-Authenticate": true, "Authentication-Info": true, "Proxy-Authentication-Info": true,
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true, "Te": true,
	"Trailer": true, "Upgrade": true, "Content-Length": true, "Content-Encoding": true,
}

// refuse audits ev as refused for reason and answers status.
func (b *Broker) refuse(w http.ResponseWriter, lines *clip.Lines, ev Event, status int, reason string) {
	ev.Reason, ev.Duration = reason, time.Since(ev.Time)
	if lines.Pass() {
		b.cfg.Logger.Debug("broker call refused", "sandbox", ev.Sandbox, "tool", ev.Tool,
			"operation", clip.String(ev.Operation, clip.Name), "reason", clip.String(reason, clip.Reason))
	}
	b.audit(ev)
	writeError(w, status, reason)
}

func (b *Broker) audit(ev Event) {
	if b.cfg.OnAudit != nil {
		b.cfg.OnAudit(ev)
	}
}

// readParams reads a call's parameters: the query string of a GET, the
// JSON object body of a POST. Values must be strings, each given once.
func readParams(r *http.Request) (map[string]string, error) {
	params := map[string]string{}
	switch r.Method {
	case http.MethodGet:
		for k, vs := range r.URL.Query() {
			if len(vs) != 1 {
				return nil, fmt.Errorf("parameter %q is given %d times", k, len(vs))
			}
			params[k] = vs[0]
		}
	case http.MethodPost:
		if len(r.URL.RawQuery) > 0 {
			return nil, errors.New("POST takes its parameters as a JSON object body, not in the query string")
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBody+1))
		if err != nil || len(body) > maxRequestBody {
			return nil, errors.New("parameters unreadable or larger than 64 KiB")
		}
		if len(bytes.TrimSpace(body)) == 0 {
			break
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		if err := dec.Decode(&params); err != nil || dec.More() {
			return nil, errors.New(`parameters must be one JSON object of strings: {"name": "value"}`)
		}
	default:
		return nil, fmt.Errorf("method %s; call an operation with GET (query parameters) or POST (JSON object)", r.Method)
	}
	return params, nil
}

// hashParams is the SHA-256 of the parameters as canonical JSON:
// encoding/json writes map keys sorted.
func hashParams(p map[string]string) string {
	b, _ := json.Marshal(p)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (o *op) check(params map[string]string) error {
	for k, v := range params {
		p := o.params[k]
		switch {
		case p == nil:
			return fmt.Errorf("operation %q takes no parameter %q", o.Name, k)
		case len(v) > p.MaxLen:
			return fmt.Errorf("parameter %q is longer than %d bytes", k, p.MaxLen)
		case !p.re.MatchString(v):
			return fmt.Errorf("parameter %q does not match %s", k, p.re.String())
		case o.inPath[k] && (v == "." || v == ".." || v == ""):
			return fmt.Errorf("parameter %q may not be %q", k, v)
		}
	}
	for name, p := range o.params {
		if _, ok := params[name]; p.Required && !ok {
			return fmt.Errorf("parameter %q is required", name)
		}
		if _, ok := params[name]; o.inPath[name] && !ok {
			return fmt.Errorf("parameter %q is required (it is part of the URL)", name)
		}
	}
	return nil
}

// request builds the upstream request.
func (o *op) request(ctx context.Context, params map[string]string, secret string) (*http.Request, error) {
	raw := placeholderPattern.ReplaceAllStringFunc(o.template, func(m string) string {
		return url.PathEscape(params[m[1:len(m)-1]])
	})
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("building the upstream URL: %v", err)
	}
	rest := map[string]string{}
	for k, v := range params {
		if !o.inPath[k] {
			rest[k] = v
		}
	}
	var body io.Reader
	if o.JSONBody {
		b, _ := json.Marshal(rest)
		body = bytes.NewReader(b)
	} else if len(rest) > 0 {
		q := u.Query()
		for k, v := range rest {
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, o.Method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("building the upstream request: %v", err)
	}
	if o.JSONBody {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", "stockade-broker")
	req.Header.Set(o.header, o.Prefix+secret)
	return req, nil
}

func (b *Broker) secret(c Credential) (string, error) {
	var s string
	switch {
	case c.Env != "":
		v, ok := "", false
		if b.cfg.LookupEnv != nil {
			v, ok = b.cfg.LookupEnv(c.Env)
		}
		if !ok {
			return "", fmt.Errorf("environment variable %s is not set", c.Env)
		}
		s = v
	default:
		data, err := os.ReadFile(c.File)
		if err != nil {
			return "", fmt.Errorf("reading credential file: %w", err)
		}
		s = strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	}
	// A very short secret could not be redacted from responses without
	// mangling them, and is no real credential anyway.
	if len(s) < 8 || strings.ContainsAny(s, "\r\n") {
		return "", errors.New("the credential is shorter than 8 bytes or spans lines")
	}
	return s, nil
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}
