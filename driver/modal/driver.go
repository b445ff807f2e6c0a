// Package modal is the `modal` driver: sandboxes are Modal Sandboxes
// (containers under gVisor on Modal's workers), driven through Modal's
// gRPC API as its client libraries (github.com/modal-labs/libmodal's
// modal-go, the Python client) call it. The Go code of the API is
// generated from the subset of Modal's protobuf definitions the driver
// uses (internal/pb). The credentials (a token id and secret) stay in
// the daemon: nothing of them is sent into a sandbox.
//
// A sandbox is created from a registry image per runtime (Config.Images)
// in one app of the workspace (Config.App), and runs Modal's default
// entrypoint until it is terminated or its timeout passes. Stockade's
// guest agent does not run there. An Exec is a command of the task's
// command router (the API libmodal's Sandbox.exec uses): the code file
// is written by a first command from its stdin, and the program runs
// under /bin/sh with a launcher (sandbox.go) that ends in
//
//	exec /usr/bin/env -i -- K=V... program args...
//
// so that the program gets exactly its environment; its stdin is written
// to the command, and its stdout and stderr are streamed back. The
// router has no call to signal a command: a timeout or a cancel
// terminates the sandbox, so that the driver declares no sessions (an
// Exec after one that was ended that way is refused; Execs one after the
// other run). What needs the guest (kernels, an exit notice,
// Stockade's checked file moves) or a supervisor (re-attach, snapshots,
// warm pools) the driver declares it lacks, with the reason.
//
// A sandbox has no network (Modal's blocked network access) unless the
// tool's record has an egress allowlist and the request asks for network
// (sandbox.NetworkAllowlist): then Modal's allowlist allows the record's
// domains (and any addresses or ranges) and nothing else. Modal, not
// Stockade's proxy, decides each connection then.
//
// The driver is tested against a fake of the API (internal/fake) shaped
// from libmodal's client source, not against the live service: `stockade
// driver check modal` tries that.
package modal

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stockade-sh/stockade/driver/modal/internal/pb"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
)

// DefaultServerURL is the API's address, as the client libraries'.
const DefaultServerURL = "https://api.modal.com:443"

// The environment variables the daemon reads its configuration from (see
// ConfigFromEnv): the names Modal's client libraries use.
const (
	EnvTokenID     = "MODAL_TOKEN_ID"
	EnvTokenSecret = "MODAL_TOKEN_SECRET"
	// EnvServerURL moves the API (a fake's, in tests and `driver check`).
	EnvServerURL   = "MODAL_SERVER_URL"
	EnvEnvironment = "MODAL_ENVIRONMENT"
)

// DefaultApp is the app of the workspace the driver's sandboxes belong to.
const DefaultApp = "stockade"

// DefaultImages are the registry images of Stockade's runtimes: Debian
// based, with /bin/sh and /usr/bin/env.
var DefaultImages = map[string]string{
	"python": "python:3.13-slim-bookworm",
	"node":   "node:24-bookworm-slim",
	"shell":  "debian:bookworm-slim",
}

// DefaultCPU is the CPU of a sandbox whose limits name none.
const DefaultCPU = 1

// MaxCPU is the most CPU the driver asks of a Modal sandbox.
const MaxCPU = 64

// builderVersion is the image builder version the client libraries send
// by default.
const builderVersion = "2024.10"

// Config configures the driver.
type Config struct {
	// TokenID and TokenSecret are the workspace's token.
	TokenID, TokenSecret string
	// ServerURL is the API's address; empty means DefaultServerURL.
	// Plain http is for loopback only (the token goes in every call).
	ServerURL string
	// Environment is the Modal environment; empty means the workspace's
	// default.
	Environment string
	// App names the app the sandboxes belong to; empty means DefaultApp.
	App string
	// Images maps Stockade's runtime images to registry images; nil
	// means DefaultImages.
	Images map[string]string
	// Defaults fill the zero fields of a Spec's limits.
	Defaults sandbox.Limits
	// Lifetime is how long a sandbox may live beyond its Exec timeout
	// (Modal's sandbox timeout): a sandbox the daemon lost ends by itself
	// then. Zero means 5 minutes.
	Lifetime time.Duration
	// CallTimeout bounds each call of the API but a command's output
	// and its wait, which last as long as the command. Zero means
	// DefaultCallTimeout.
	CallTimeout time.Duration
	// StartTimeout bounds the wait for a new sandbox's task (its image
	// pulled and started). Zero means 5 minutes.
	StartTimeout time.Duration
}

// DefaultCallTimeout bounds one call of the API (Config.CallTimeout).
const DefaultCallTimeout = 30 * time.Second

// maxMessage bounds a message the driver receives: the API's answers are
// small, and a command's output comes in chunks.
const maxMessage = 8 << 20

// ConfigFromEnv reads the credentials and the API's address from getenv.
func ConfigFromEnv(getenv func(string) string) Config {
	return Config{TokenID: getenv(EnvTokenID), TokenSecret: getenv(EnvTokenSecret), ServerURL: getenv(EnvServerURL), Environment: getenv(EnvEnvironment)}
}

// Driver implements sandbox.Driver on Modal Sandboxes. It is safe for
// concurrent use. New does no I/O: the connection is made on first use.
type Driver struct {
	cfg    Config
	conn   *grpc.ClientConn
	api    pb.ModalClientClient
	health sandboxkit.HealthCache

	mu      sync.Mutex
	token   string    // the auth token of AuthTokenGet
	expires time.Time // when token expires
	appID   string
	images  map[string]string       // runtime image name -> Modal image id
	routers map[string]*routerConn  // router URL -> connection, while a sandbox holds it
	live    map[string]*liveSandbox // by sandbox.ID, until destroyed and seen ended (or evicted)
}

var (
	_ sandbox.Driver        = (*Driver)(nil)
	_ sandbox.HealthChecker = (*Driver)(nil)
	_ sandbox.Leftovers     = (*Driver)(nil)
	_ sandbox.Reaper        = (*Driver)(nil)
)

// New returns a driver for cfg. It needs the token id and secret.
func New(cfg Config) (*Driver, error) {
	var missing []string
	for _, c := range []struct{ v, name string }{{cfg.TokenID, EnvTokenID}, {cfg.TokenSecret, EnvTokenSecret}} {
		if c.v == "" {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return nil, errdefs.Publicf("modal: the driver needs %s in the environment: %w", strings.Join(missing, ", "), errdefs.ErrInvalidArgument)
	}
	if cfg.ServerURL == "" {
		cfg.ServerURL = DefaultServerURL
	}
	target, creds, err := dialTarget(cfg.ServerURL)
	if err != nil {
		return nil, errdefs.Publicf("modal: API address %q: %v: %w", redacted(cfg.ServerURL), err, errdefs.ErrInvalidArgument)
	}
	if cfg.App == "" {
		cfg.App = DefaultApp
	}
	if cfg.Images == nil {
		cfg.Images = DefaultImages
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 5 * time.Minute
	}
	if cfg.Lifetime == 0 {
		cfg.Lifetime = 5 * time.Minute
	}
	cfg.Defaults = cfg.Defaults.WithDefaults(sandbox.Limits{CPU: DefaultCPU}).WithDefaults(sandbox.DefaultLimits())
	d := &Driver{cfg: cfg, images: map[string]string{}, routers: map[string]*routerConn{}, live: map[string]*liveSandbox{}}
	d.conn, err = grpc.NewClient(target, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)),
		grpc.WithChainUnaryInterceptor(d.unaryAuth), grpc.WithChainStreamInterceptor(d.streamAuth))
	if err != nil {
		return nil, errdefs.Publicf("modal: API address %q: %v: %w", redacted(cfg.ServerURL), err, errdefs.ErrInvalidArgument)
	}
	d.api = pb.NewModalClientClient(d.conn)
	d.health.Check = d.checkHealth
	return d, nil
}

// dialTarget is the gRPC target and transport of an API or router URL:
// TLS for https, plain only for http to loopback.
func dialTarget(raw string) (string, credentials.TransportCredentials, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", nil, errors.New("not an http(s) URL of a host")
	}
	if u.User != nil {
		// The credentials go in headers; a URL's would be logged.
		return "", nil, errors.New("a URL with a user or password")
	}
	host := u.Host
	switch u.Scheme {
	case "https":
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "443")
		}
		return host, credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12}), nil
	case "http":
		if !loopback(u.Hostname()) {
			return "", nil, errors.New("plain http to a host that is not loopback would send the token in the clear; use https")
		}
		return host, insecure.NewCredentials(), nil
	}
	return "", nil, errors.New("not an http(s) URL")
}

// redacted is URL raw for a message: its password hidden, or nothing of
// it when it does not parse.
func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}

// loopback tells whether host (of a URL) is this machine's.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// Close closes the driver's connections.
func (d *Driver) Close() error {
	d.mu.Lock()
	conns := []*grpc.ClientConn{d.conn}
	for _, c := range d.routers {
		conns = append(conns, c.conn)
	}
	d.routers = map[string]*routerConn{}
	d.mu.Unlock()
	var errs []error
	for _, c := range conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

func (d *Driver) Name() string { return "modal" }

func (d *Driver) Capabilities() sandbox.Capabilities { return Capabilities() }

// Capabilities are what the modal driver declares, without building one.
func Capabilities() sandbox.Capabilities {
	const noGuest = "Stockade's guest agent does not run in a Modal sandbox"
	return sandbox.Capabilities{
		Tier:         sandbox.TierGVisor,
		SharedKernel: false,
		Remote:       true,
		Boundary:     "a Modal Sandbox: a container under gVisor on Modal's workers",
		DefaultCPU:   DefaultCPU,
		NetworkModes: []sandbox.NetworkMode{sandbox.NetworkNone, sandbox.NetworkAllowlist},
		Sessions:     false,
		Health:       true,
		Leftovers:    true,
		Reap:         true,
		Lacks: map[string]string{
			"Files":      noGuest + ": only the code file and the program's input are written",
			"Kernels":    noGuest + ": no interpreter keeps state between cells",
			"Bind":       "a Modal sandbox's image, resources and network are fixed when it is created for its execution: no warm pool",
			"BindEgress": "there is no Bind",
			"Reattach":   "the driver keeps no record of its sandboxes outside the daemon; each ends at its timeout instead",
			"Snapshots":  "not implemented for Modal's filesystem snapshots, which restore files only, not processes",
		},
	}
}

// Health tells whether the API answers with the credentials (an auth
// token and the app), from a cache.
func (d *Driver) Health(ctx context.Context) error { return d.health.Health(ctx) }

func (d *Driver) checkHealth(ctx context.Context) error {
	_, err := d.app(ctx)
	return err
}

// Create creates a Modal sandbox of spec's runtime and waits for its
// task to run (within Config.StartTimeout). When the answer is lost, a
// sandbox the driver knows the id of is terminated before Create returns
// the error.
func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	id, err := sandbox.ResolveID(spec.ID)
	if err != nil {
		return nil, err
	}
	bad := func(format string, a ...any) error {
		return errdefs.Publicf("modal: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	access, err := accessOf(spec)
	switch {
	case d.cfg.Images[spec.Image.Name] == "":
		return nil, bad("no Modal image for image %q (python, node and shell have one)", spec.Image.Name)
	case err != nil:
		return nil, err
	case len(spec.Mounts) > 0:
		return nil, bad("a Modal sandbox cannot mount a host directory")
	case spec.Detached:
		return nil, bad("%s", Capabilities().Lacks["Reattach"])
	case spec.Workspace > 0:
		return nil, bad("a Modal sandbox has no /workspace of Stockade's")
	}
	lim := spec.Limits.WithDefaults(d.cfg.Defaults)
	if err := lim.Check(sandbox.Limits{CPU: MaxCPU}); err != nil {
		return nil, err
	}
	appID, err := d.app(ctx)
	if err != nil {
		return nil, err
	}
	imageID, err := d.image(ctx, appID, spec.Image.Name)
	if err != nil {
		return nil, err
	}
	name := namePrefix + id
	mem := uint32(min(lim.Memory>>20, 1<<31))
	def := &pb.Sandbox{
		ImageId:       imageID,
		TimeoutSecs:   uint32((lim.Timeout + d.cfg.Lifetime + time.Second - 1) / time.Second),
		Resources:     &pb.Resources{MilliCpu: uint32(lim.CPU * 1000), MilliCpuMax: uint32(lim.CPU * 1000), MemoryMb: mem, MemoryMbMax: mem},
		NetworkAccess: access,
		BlockNetwork:  access.GetNetworkAccessType() == pb.NetworkAccess_BLOCKED,
		Name:          &name,
	}
	cctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	resp, err := d.api.SandboxCreate(cctx, &pb.SandboxCreateRequest{AppId: appID, Definition: def})
	cancel()
	sbID := resp.GetSandboxId()
	refused := refusal(err)
	if err != nil {
		err = callError(ctx, "creating a sandbox", err)
	} else if cerr := checkID("sandbox id", sbID); cerr != nil {
		err = unreadable("creating a sandbox", cerr)
	}
	if err != nil {
		if refused {
			return nil, err
		}
		// The sandbox may exist all the same, untagged, and would run
		// (and be billed) until its timeout: terminate it, found by its
		// name, even when ctx has ended. One the service creates only
		// after this looks is left to Reap, which finds it by its name.
		if derr := d.terminateNamed(context.WithoutCancel(ctx), appID, name); derr != nil {
			return nil, fmt.Errorf("%w (and terminating what it may have created: %v)", err, derr)
		}
		return nil, err
	}
	sb := &Sandbox{d: d, id: id, sandboxID: sbID, limits: lim}
	d.mu.Lock()
	d.remember(id, sbID)
	d.mu.Unlock()
	// The labels as the sandbox's tags, which Reap lists it by, as
	// libmodal's Sandbox.SetTags sets them.
	err = d.setTags(ctx, sbID, spec.Labels)
	if err == nil {
		sb.taskID, err = d.task(ctx, sbID)
	}
	if err != nil {
		if derr := sb.terminate(context.WithoutCancel(ctx)); derr != nil {
			return nil, fmt.Errorf("%w (and terminating the sandbox: %v)", err, derr)
		}
		return nil, err
	}
	return sb, nil
}

// liveSandbox is a sandbox this driver created, for Leftovers.
type liveSandbox struct {
	sandboxID string
	destroyed bool
}

// maxLive bounds the sandboxes Leftovers knows: beyond it, the destroyed
// ones are forgotten (each ends at its timeout anyway).
const maxLive = 4096

// remember records sandbox id (Modal's sbID) for Leftovers.
func (d *Driver) remember(id, sbID string) {
	if len(d.live) >= maxLive {
		for k, l := range d.live {
			if l.destroyed {
				delete(d.live, k)
			}
		}
	}
	d.live[id] = &liveSandbox{sandboxID: sbID}
}

// destroyed marks sandbox id destroyed.
func (d *Driver) destroyed(id string) {
	d.mu.Lock()
	if l := d.live[id]; l != nil {
		l.destroyed = true
	}
	d.mu.Unlock()
}

// setTags sets the tags of sandbox sbID to labels.
func (d *Driver) setTags(ctx context.Context, sbID string, labels map[string]string) error {
	if len(labels) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	defer cancel()
	if _, err := d.api.SandboxTagsSet(cctx, &pb.SandboxTagsSetRequest{EnvironmentName: d.cfg.Environment, SandboxId: sbID, Tags: tagsOf(labels)}); err != nil {
		return callError(ctx, "tagging a sandbox", err)
	}
	return nil
}

// tagsOf returns labels as tags, by key.
func tagsOf(labels map[string]string) []*pb.SandboxTag {
	tags := make([]*pb.SandboxTag, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		tags = append(tags, &pb.SandboxTag{TagName: k, TagValue: labels[k]})
	}
	return tags
}

// namePrefix starts the name of every sandbox of this driver.
const namePrefix = "stockade-"

// task waits for sandbox sbID's task, as the client libraries' exec does
// first, within the start timeout.
func (d *Driver) task(ctx context.Context, sbID string) (string, error) {
	sctx, cancel := context.WithTimeout(ctx, d.cfg.StartTimeout)
	defer cancel()
	for {
		wait := float32(10)
		resp, err := d.api.SandboxGetTaskId(sctx, &pb.SandboxGetTaskIdRequest{SandboxId: sbID, Timeout: &wait, WaitUntilReady: true})
		if err != nil {
			return "", callError(ctx, "waiting for the sandbox to start", err)
		}
		if r := resp.GetTaskResult(); r != nil && r.GetStatus() != pb.GenericResult_GENERIC_STATUS_UNSPECIFIED {
			return "", fmt.Errorf("modal: the sandbox ended before it ran: %s: %s: %w", r.GetStatus(), clip(r.GetException()), errdefs.ErrUnavailable)
		}
		if t := resp.GetTaskId(); t != "" {
			if err := checkID("task id", t); err != nil {
				return "", unreadable("waiting for the sandbox to start", err)
			}
			return t, nil
		}
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("modal: waiting for the sandbox to start: %w", err)
		}
		if err := sctx.Err(); err != nil {
			return "", fmt.Errorf("modal: the sandbox did not start within %v: %w", d.cfg.StartTimeout, errdefs.ErrUnavailable)
		}
	}
}

// Leftovers says whether the provider still runs sandbox id, of those
// this driver created.
func (d *Driver) Leftovers(ctx context.Context, id string) []string {
	d.mu.Lock()
	l, ok := d.live[id]
	d.mu.Unlock()
	if !ok {
		return nil
	}
	sbID := l.sandboxID
	cctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	defer cancel()
	resp, err := d.api.SandboxWait(cctx, &pb.SandboxWaitRequest{SandboxId: sbID, Timeout: 0})
	switch {
	case status.Code(err) == codes.NotFound:
	case err != nil:
		return []string{fmt.Sprintf("sandbox %s: %v", id, callError(ctx, "looking up a sandbox", err))}
	case resp.GetResult() == nil || resp.GetResult().GetStatus() == pb.GenericResult_GENERIC_STATUS_UNSPECIFIED:
		return []string{fmt.Sprintf("Modal sandbox %s of %s runs", sbID, id)}
	}
	d.mu.Lock()
	delete(d.live, id)
	d.mu.Unlock()
	return nil
}

// accessOf is Modal's network access of a sandbox of spec: blocked, or
// an allowlist of the record's entries, as Modal's Python client sends
// its outbound_domain_allowlist and outbound_cidr_allowlist: domain names
// and "*." wildcards in allowed_domains, IP addresses and ranges in
// allowed_cidrs. The record's ports are not enforced there.
func accessOf(spec sandbox.Spec) (*pb.NetworkAccess, error) {
	switch spec.Network {
	case sandbox.NetworkNone:
		return &pb.NetworkAccess{NetworkAccessType: pb.NetworkAccess_BLOCKED, AllowedCidrs: []string{}}, nil
	case sandbox.NetworkAllowlist:
	default:
		return nil, errdefs.Publicf("modal: a Modal sandbox has no egress through Stockade's proxy, only the provider's allowlist: %w", errdefs.ErrInvalidArgument)
	}
	if len(spec.Allow) == 0 {
		return nil, errdefs.Publicf("modal: an allowlist network needs entries: %w", errdefs.ErrInvalidArgument)
	}
	acc := &pb.NetworkAccess{NetworkAccessType: pb.NetworkAccess_ALLOWLIST, AllowedCidrs: []string{}, AllowedDomains: []string{}}
	for _, a := range spec.Allow {
		if p, err := netip.ParsePrefix(a); err == nil {
			acc.AllowedCidrs = append(acc.AllowedCidrs, p.Masked().String())
			continue
		}
		if ip, err := netip.ParseAddr(a); err == nil {
			acc.AllowedCidrs = append(acc.AllowedCidrs, netip.PrefixFrom(ip, ip.BitLen()).String())
			continue
		}
		if a == "" || a == "*" || strings.ContainsAny(a, "/: \x00") {
			return nil, errdefs.Publicf("modal: allowlist entry %q is no domain name, address or range: %w", a, errdefs.ErrInvalidArgument)
		}
		acc.AllowedDomains = append(acc.AllowedDomains, a)
	}
	return acc, nil
}
