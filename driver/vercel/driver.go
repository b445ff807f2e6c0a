// Package vercel is the `vercel` driver: sandboxes are Firecracker microVMs
// of Vercel Sandbox, driven through its REST API as the official SDK
// (@vercel/sandbox 3.x) calls it. The credentials (a team's access token,
// the team and the project) stay in the daemon: nothing of them is sent
// into a sandbox.
//
// Stockade's guest agent does not run there. An Exec is one command of
// the provider's command API, its output streamed as NDJSON and its exit
// code at the end; the code file and the program's stdin are written with
// the provider's file API first, and the command is /bin/sh running a
// launcher (sandbox.go) that ends in
//
//	exec /usr/bin/env -i -- K=V... program args...
//
// so that the program gets exactly its environment and its input. What
// needs the guest (kernels, a streamed stdin, an exit notice, Stockade's
// checked file moves) or a supervisor (re-attach, snapshots, warm pools)
// the driver declares it lacks, with the reason, so that the engine
// refuses it.
//
// A sandbox has no network (the provider's deny-all network policy)
// unless the tool's record has an egress allowlist and the request asks
// for network (sandbox.NetworkAllowlist): then the provider's policy
// allows the record's domains and nothing else. The provider, not
// Stockade's proxy, decides each connection then; none is audited by
// Stockade, and the record's ports are not enforced.
//
// The driver is tested against a fake of the API (internal/fake) whose
// shapes are recorded from the SDK's own requests (sdk_test.go), not
// against the live service: `stockade driver check vercel` tries that.
package vercel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
)

// DefaultBaseURL is the API's address, as the SDK's.
const DefaultBaseURL = "https://vercel.com/api"

// The environment variables the daemon reads its credentials from (see
// ConfigFromEnv): the names the Vercel CLI and SDK use.
const (
	EnvToken   = "VERCEL_TOKEN"
	EnvTeam    = "VERCEL_TEAM_ID"
	EnvProject = "VERCEL_PROJECT_ID"
	// EnvBaseURL moves the API (a fake's, in tests and `driver check`).
	EnvBaseURL = "STOCKADE_VERCEL_API"
)

// DefaultCPU is the vCPUs of a sandbox whose limits name none: the
// provider's smallest.
const DefaultCPU = 1

// MaxCPU is the most vCPUs a Vercel sandbox has.
const MaxCPU = 8

// Runtimes maps Stockade's runtime images to the provider's runtimes: the
// shell runtime is /bin/sh on node24.
var Runtimes = map[string]string{"python": "python3.13", "node": "node24", "shell": "node24"}

// namePrefix starts the name of every sandbox of this driver.
const namePrefix = "stockade-"

// Config configures the driver.
type Config struct {
	// Token is the team's access token, sent as a bearer token.
	Token string
	// TeamID and ProjectID name the team and the project the sandboxes
	// belong to.
	TeamID, ProjectID string
	// BaseURL is the API's address; empty means DefaultBaseURL. Plain
	// http is for loopback only (the token goes in every request).
	BaseURL string
	// Defaults fill the zero fields of a Spec's limits.
	Defaults sandbox.Limits
	// Lifetime is how long a sandbox may live beyond its Exec timeout
	// (the provider's sandbox timeout is the Exec timeout and this): a
	// sandbox the daemon lost ends by itself then. Zero means 5 minutes.
	Lifetime time.Duration
	// CallTimeout bounds each call of the API (its answer read whole),
	// but a command's stream, which lasts as long as the command: until
	// its answer starts, the Exec's ctx and timeout bound that one. Zero
	// means DefaultCallTimeout.
	CallTimeout time.Duration
	// Client is the HTTP client; nil means one with no overall timeout
	// (each call is bounded by its context, see CallTimeout).
	Client *http.Client
}

// DefaultCallTimeout bounds one call of the API (Config.CallTimeout), as
// the docker driver bounds its removals.
const DefaultCallTimeout = 30 * time.Second

// ConfigFromEnv reads the credentials and the API's address from getenv.
func ConfigFromEnv(getenv func(string) string) Config {
	return Config{Token: getenv(EnvToken), TeamID: getenv(EnvTeam), ProjectID: getenv(EnvProject), BaseURL: getenv(EnvBaseURL)}
}

// Driver implements sandbox.Driver on Vercel Sandbox. It is safe for
// concurrent use. New does no I/O.
type Driver struct {
	cfg    Config
	base   *url.URL
	health sandboxkit.HealthCache
}

var (
	_ sandbox.Driver        = (*Driver)(nil)
	_ sandbox.HealthChecker = (*Driver)(nil)
	_ sandbox.Leftovers     = (*Driver)(nil)
	_ sandbox.Reaper        = (*Driver)(nil)
)

// New returns a driver for cfg. It needs the three credentials.
func New(cfg Config) (*Driver, error) {
	var missing []string
	for _, c := range []struct{ v, name string }{{cfg.Token, EnvToken}, {cfg.TeamID, EnvTeam}, {cfg.ProjectID, EnvProject}} {
		if c.v == "" {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return nil, errdefs.Publicf("vercel: the driver needs %s in the environment: %w", strings.Join(missing, ", "), errdefs.ErrInvalidArgument)
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	base, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, errdefs.Publicf("vercel: API address %q is no http(s) URL: %w", cfg.BaseURL, errdefs.ErrInvalidArgument)
	}
	if base.Scheme == "http" && !loopback(base.Hostname()) {
		return nil, errdefs.Publicf("vercel: API address %q is plain http to a host that is not loopback, which would send the token in the clear; use https: %w", cfg.BaseURL, errdefs.ErrInvalidArgument)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Lifetime == 0 {
		cfg.Lifetime = 5 * time.Minute
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	cfg.Defaults = cfg.Defaults.WithDefaults(sandbox.Limits{CPU: DefaultCPU}).WithDefaults(sandbox.DefaultLimits())
	d := &Driver{cfg: cfg, base: base}
	d.health.Check = d.checkHealth
	return d, nil
}

// loopback tells whether host (of a URL) is this machine's: localhost or
// a loopback address, which plain http may reach (a fake, a local proxy).
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (d *Driver) Name() string { return "vercel" }

func (d *Driver) Capabilities() sandbox.Capabilities { return Capabilities() }

// Capabilities are what the vercel driver declares, without building one.
func Capabilities() sandbox.Capabilities {
	const noGuest = "Stockade's guest agent does not run in a Vercel sandbox"
	return sandbox.Capabilities{
		Tier:         sandbox.TierMicroVM,
		SharedKernel: false,
		Remote:       true,
		Boundary:     "a Firecracker microVM of Vercel Sandbox (hardware virtualisation, the provider's hosts)",
		DefaultCPU:   DefaultCPU,
		NetworkModes: []sandbox.NetworkMode{sandbox.NetworkNone, sandbox.NetworkAllowlist},
		Sessions:     true,
		Health:       true,
		Reap:         true,
		Leftovers:    true,
		Lacks: map[string]string{
			"Files":      noGuest + ", and the provider's file API follows symbolic links and lists no directories: only the code file and the program's input are written",
			"Kernels":    noGuest + ": a command of the provider's API ends with its process, and no interpreter keeps state between cells",
			"Bind":       "a Vercel sandbox's resources and network policy are fixed when it is created for its execution: no warm pool",
			"BindEgress": "there is no Bind",
			"Reattach":   "the driver keeps no record of its sandboxes outside the daemon; each ends at its provider timeout instead",
			"Snapshots":  "the provider's snapshots stop the sandbox and restore files only, not its processes",
		},
	}
}

// Health tells whether the API answers with the credentials (a list of
// one sandbox of the project), from a cache.
func (d *Driver) Health(ctx context.Context) error { return d.health.Health(ctx) }

func (d *Driver) checkHealth(ctx context.Context) error {
	_, err := d.list(ctx, nil, 1)
	return err
}

// Create creates a sandbox of spec's runtime. As the SDK's
// Sandbox.create, it returns with the provider's answer to the create and
// does not poll the sandbox until it runs. When the answer is lost or
// unreadable (all but a refusal, 4xx), the sandbox may exist all the
// same: Create deletes it by its name before it returns the error.
func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	id, err := sandbox.ResolveID(spec.ID)
	if err != nil {
		return nil, err
	}
	runtime, ok := Runtimes[spec.Image.Name]
	bad := func(format string, a ...any) error {
		return errdefs.Publicf("vercel: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	switch {
	case !ok:
		return nil, bad("no Vercel runtime for image %q (python, node and shell have one)", spec.Image.Name)
	case spec.Network != sandbox.NetworkNone && spec.Network != sandbox.NetworkAllowlist:
		return nil, bad("a Vercel sandbox has no egress through Stockade's proxy, only the provider's allowlist")
	case spec.Network == sandbox.NetworkAllowlist && len(spec.Allow) == 0:
		return nil, bad("an allowlist network needs domains")
	case len(spec.Mounts) > 0:
		return nil, bad("a Vercel sandbox cannot mount a host directory")
	case spec.Detached:
		return nil, bad("%s", Capabilities().Lacks["Reattach"])
	case spec.Workspace > 0:
		return nil, bad("a Vercel sandbox has no /workspace of Stockade's")
	}
	lim := spec.Limits.WithDefaults(d.cfg.Defaults)
	if err := lim.Check(sandbox.Limits{CPU: MaxCPU}); err != nil {
		return nil, err
	}
	tags := tagsOf(spec.Labels)
	req := createRequest{
		ProjectID:     d.cfg.ProjectID,
		Name:          namePrefix + id,
		Ports:         []int{},
		Timeout:       (lim.Timeout + d.cfg.Lifetime).Milliseconds(),
		Resources:     &resources{VCPUs: max(1, int(math.Ceil(lim.CPU)))},
		Runtime:       runtime,
		NetworkPolicy: policyOf(spec),
		Tags:          tags,
	}
	var a createAnswer
	body, err := d.call(ctx, "creating a sandbox", http.MethodPost, "/v2/sandboxes", nil, req)
	if err == nil {
		if a, err = decodeCreate(body); err != nil {
			err = fmt.Errorf("vercel: creating a sandbox: %v: %w", err, errdefs.ErrUnavailable)
		}
	}
	if err != nil {
		if refused(err) {
			return nil, err
		}
		// A sandbox the daemon does not know of would run, and be
		// billed, until its provider timeout: delete it by its name
		// (each call is bounded, see send), even when ctx has ended.
		lost := &Sandbox{d: d, id: id, name: req.Name}
		if derr := lost.remove(context.WithoutCancel(ctx)); derr != nil {
			return nil, fmt.Errorf("%w (and deleting what it may have created: %v)", err, derr)
		}
		return nil, err
	}
	return &Sandbox{d: d, id: id, name: a.Sandbox.Name, session: a.Session.ID, limits: lim}, nil
}

// Leftovers says whether the provider still runs sandbox id.
func (d *Driver) Leftovers(ctx context.Context, id string) []string {
	body, err := d.call(ctx, "looking up a sandbox", http.MethodGet, "/v2/sandboxes/"+url.PathEscape(namePrefix+id), url.Values{"projectId": {d.cfg.ProjectID}}, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return []string{fmt.Sprintf("sandbox %s: %v", id, err)}
	}
	a, err := decodeSandbox(body)
	if err != nil {
		return []string{fmt.Sprintf("sandbox %s: %v", id, err)}
	}
	switch a.Sandbox.Status {
	case "stopped", "failed", "aborted":
		return nil
	}
	return []string{fmt.Sprintf("Vercel sandbox %s is %s", a.Sandbox.Name, a.Sandbox.Status)}
}

// Reap deletes every sandbox of the project this driver named whose
// tags contain all of match, as the SDK's delete does (no stop first).
// Its error joins each sandbox's, their classes kept.
func (d *Driver) Reap(ctx context.Context, match map[string]string) ([]string, error) {
	names, err := d.list(ctx, match, 0)
	if err != nil {
		return nil, err
	}
	var reaped []string
	var errs []error
	for _, name := range names {
		sb := &Sandbox{d: d, id: strings.TrimPrefix(name, namePrefix), name: name}
		if err := sb.remove(ctx); err != nil {
			errs = append(errs, err)
			continue
		}
		reaped = append(reaped, sb.id)
	}
	if len(errs) > 0 {
		return reaped, fmt.Errorf("vercel: reaping: %w", errors.Join(errs...))
	}
	return reaped, nil
}

// list returns the names of this driver's sandboxes of the project that
// are not stopped and whose tags contain match, at most limit (0: all,
// within 20 pages).
func (d *Driver) list(ctx context.Context, match map[string]string, limit int) ([]string, error) {
	var names []string
	cursor := ""
	for range 20 {
		q := url.Values{"project": {d.cfg.ProjectID}, "namePrefix": {namePrefix}, "limit": {"100"}}
		if limit > 0 {
			q.Set("limit", fmt.Sprint(limit))
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		body, err := d.call(ctx, "listing sandboxes", http.MethodGet, "/v2/sandboxes", q, nil)
		if err != nil {
			return nil, err
		}
		a, err := decodeList(body)
		if err != nil {
			return nil, err
		}
	next:
		for _, s := range a.Sandboxes {
			if !strings.HasPrefix(s.Name, namePrefix) || s.Status == "stopped" {
				continue
			}
			for k, v := range match {
				if s.Tags[k] != v {
					continue next
				}
			}
			names = append(names, s.Name)
		}
		if limit > 0 || a.Pagination.Next == nil || *a.Pagination.Next == "" {
			return names, nil
		}
		cursor = *a.Pagination.Next
	}
	return names, nil
}

// request builds a request of the API: the path below the base, the
// team in the query, the token in Authorization.
func (d *Driver) request(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string) (*http.Request, error) {
	u := *d.base
	u.Path += path
	if q == nil {
		q = url.Values{}
	}
	q.Set("teamId", d.cfg.TeamID)
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+d.cfg.Token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("User-Agent", "stockade (vercel driver)")
	return req, nil
}

// apiCall is one call of the API.
type apiCall struct {
	what, method, path string
	query              url.Values
	body               []byte
	contentType        string
	header             map[string]string
	// max, when positive, reads at most max bytes of a 2xx answer and
	// drops the rest; zero reads the whole answer, at most maxBody.
	max int64
}

// call makes a JSON call, in marshalled (nil: no body), and returns the
// answer's body (see send).
func (d *Driver) call(ctx context.Context, what, method, path string, q url.Values, in any) ([]byte, error) {
	c := apiCall{what: what, method: method, path: path, query: q}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		c.body, c.contentType = b, "application/json"
	}
	b, _, err := d.send(ctx, c)
	return b, err
}

// send makes call c within the call timeout (Config.CallTimeout), its
// answer read whole: it returns the body and its content type, or the
// classed error of an answer that is not 2xx (apiError). A call the
// provider does not answer in time is ErrUnavailable.
func (d *Driver) send(ctx context.Context, c apiCall) ([]byte, string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	defer cancel()
	req, err := d.request(ctx, c.method, c.path, c.query, bytes.NewReader(c.body), c.contentType)
	if err != nil {
		return nil, "", err
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := d.cfg.Client.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("vercel: %s: %v: %w", c.what, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := readBody(resp.Body)
		return nil, "", apiError(c.what, resp.StatusCode, b)
	}
	var b []byte
	if c.max > 0 {
		b, err = io.ReadAll(io.LimitReader(resp.Body, c.max))
	} else {
		b, err = readBody(resp.Body)
	}
	if err != nil {
		return nil, "", fmt.Errorf("vercel: %s: %v: %w", c.what, err, errdefs.ErrUnavailable)
	}
	return b, resp.Header.Get("Content-Type"), nil
}

// maxTags is the provider's bound on a sandbox's tags.
const maxTags = 5

// tagsOf returns the tags of a sandbox of labels: at most maxTags of
// them, the owner's first (the daemon reaps by it), then by key. Reap
// matches only what was kept.
func tagsOf(labels map[string]string) map[string]string {
	keys := slices.Sorted(maps.Keys(labels))
	if i := slices.Index(keys, "stockade.owner"); i > 0 {
		owner := keys[i]
		keys = append([]string{owner}, slices.Delete(keys, i, i+1)...)
	}
	tags := map[string]string{}
	for _, k := range keys[:min(len(keys), maxTags)] {
		tags[k] = labels[k]
	}
	return tags
}

// policyOf is the provider's network policy of a sandbox of spec:
// deny-all, or the allowlist's domains. The provider's policy names
// domains, not ports: the record's ports are not enforced there.
func policyOf(spec sandbox.Spec) networkPolicy {
	if spec.Network != sandbox.NetworkAllowlist {
		return denyAll
	}
	return networkPolicy{Allow: slices.Clone(spec.Allow)}
}
