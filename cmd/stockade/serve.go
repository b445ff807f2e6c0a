package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/analytics"
	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/console"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/flock"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/internal/templatejobs"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/mcp"
	"github.com/stockade-sh/stockade/sandbox"
)

func init() {
	commands["serve"] = command{summary: "run the Stockade daemon (HTTP API)", run: serveCmd}
}

const serveSynopsis = `usage: stockade serve [--config FILE] [--listen 127.0.0.1:8700] [--db URL] [--egress=false]

Runs the daemon: the HTTP API on --listen, over the database --db.

Stopping it: SIGTERM, SIGINT or SIGHUP stops the daemon and, with
--sessions-on-shutdown=keep (the default), keeps its sessions' sandboxes
running, for the next start on the same state directory and database to
serve them again; a session no daemon serves any more ends by itself
shortly after its ttl. A session on a driver that cannot re-attach a
sandbox (docker, kubernetes) cannot outlive its daemon: at every stop
the daemon destroys its sandbox and ends it (interrupted, with an
end_detail saying why), and after a crash the next start does. With
--sessions-on-shutdown=end, or on SIGUSR2 whatever that says, the
daemon ends every session first (reason interrupted, audited; a running
cell is killed), for a daemon stopped for good.`

func serveCmd(ctx context.Context, args []string) int {
	fs, cfg, load := serveFlags()
	pos, err := load(args)
	if err != nil {
		return fail(flagErr(fs, err))
	}
	if len(pos) > 0 {
		return fail(usagef("serve takes no arguments"))
	}
	cfg.Serving = true
	// The broker reads credentials that name a variable from the daemon's
	// environment; only the CLI may hand it over.
	cfg.LookupEnv = os.LookupEnv
	if err := serve(ctx, cfg.Listen, cfg.DB, *cfg); err != nil {
		return fail(err)
	}
	return 0
}

// serveFlags returns the daemon's flags. Every flag sets the configuration
// key of its name (--max-queue sets max_queue), and every key but the
// structured ones (defaults, ceiling, broker, pools) has its flag; the README's
// configuration table lists them all (TestServeFlagsMatchConfigKeys).
func serveFlags() (*flag.FlagSet, *config.Config, func([]string) ([]string, error)) {
	fs := newFlags("serve", serveSynopsis)
	cfg, load := configFlags(fs, withConfigFile)
	fs.StringVar(&cfg.Driver, "driver", cfg.Driver, "default driver: gvisor, runc, docker, vercel, modal or kubernetes (env STOCKADE_DRIVER; kubernetes runs every sandbox as a pod of the cluster, see the kubernetes- flags)")
	fs.StringVar(&cfg.Vercel.TeamID, "vercel-team-id", cfg.Vercel.TeamID, "the Vercel team of the vercel driver's sandboxes (env VERCEL_TEAM_ID; its token: env VERCEL_TOKEN only)")
	fs.StringVar(&cfg.Vercel.ProjectID, "vercel-project-id", cfg.Vercel.ProjectID, "the Vercel project of the vercel driver's sandboxes (env VERCEL_PROJECT_ID)")
	fs.StringVar(&cfg.Modal.Environment, "modal-environment", cfg.Modal.Environment, "the Modal environment of the modal driver's sandboxes (env MODAL_ENVIRONMENT; its token: env MODAL_TOKEN_ID, MODAL_TOKEN_SECRET only)")
	fs.StringVar(&cfg.Modal.App, "modal-app", cfg.Modal.App, "the Modal app of the modal driver's sandboxes (default stockade)")
	fs.StringVar(&cfg.Modal.API, "modal-api", cfg.Modal.API, "Modal's API address, https or loopback http (env MODAL_SERVER_URL; default Modal's)")
	fs.StringVar(&cfg.Vercel.API, "vercel-api", cfg.Vercel.API, "the Vercel Sandbox API's address, https or loopback http (env STOCKADE_VERCEL_API; default Vercel's)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP listen address")
	fs.StringVar(&cfg.DB, "db", cfg.DB, "database URL: sqlite:PATH or postgres://... (env STOCKADE_DB; default sqlite in the data directory)")
	fs.StringVar(&cfg.AuditWitness, "audit-witness", cfg.AuditWitness, "directory witnessing the audit chains' heads (env STOCKADE_AUDIT_WITNESS; default next to a SQLite file)")
	toolsFlag(fs, cfg)
	templatesFlag(fs, cfg)
	fs.StringVar(&cfg.TemplateSources.Mirror, "template-sources-mirror", cfg.TemplateSources.Mirror, "the Debian mirror of templates' debian_packages")
	fs.StringVar(&cfg.TemplateSources.Wheelhouse, "template-sources-wheelhouse", cfg.TemplateSources.Wheelhouse, "the directory of the wheels templates name by file (default DATA_DIR/wheelhouse)")
	fs.StringVar(&cfg.TemplateSources.PythonIndex, "template-sources-python-index", cfg.TemplateSources.PythonIndex, "a PEP 503 simple index of the wheels templates name by project==version (default none)")
	fs.StringVar(&cfg.TemplateSources.NPMRegistry, "template-sources-npm-registry", cfg.TemplateSources.NPMRegistry, "the npm registry of templates' npm_packages")
	fs.StringVar(&cfg.DataRoot, "data-root", cfg.DataRoot, "the only directory tools may mount data from (default DATA_DIR/data)")
	fs.BoolVar(&cfg.Egress, "egress", true, "give approved network requests egress through the host's proxy (needs root and nftables)")
	fs.StringVar(&cfg.EgressRange, "egress-range", cfg.EgressRange, "IPv4 range of the sandbox networks, a /30 each")
	fs.StringVar(&cfg.EgressPrefix, "egress-prefix", cfg.EgressPrefix, "name prefix of the sandbox networks' host objects, 2-6 lower-case letters")
	fs.IntVar(&cfg.MaxConcurrent, "max-concurrent", cfg.MaxConcurrent, "sandboxes running at once")
	fs.IntVar(&cfg.MaxQueue, "max-queue", cfg.MaxQueue, "invocations waiting for a slot (default 2 x max-concurrent; negative: no queue)")
	durationFlag(fs, &cfg.PoolMaxAge, "pool-max-age", cfg.PoolMaxAge, "how long a warm pool sandbox waits before it is replaced")
	fs.Var((*sizeValue)(&cfg.MemoryBudget), "memory-budget", "memory limits of the live and pooled sandboxes together; past it invocations are refused (0: no bound; default 3/4 of the host's memory)")
	durationFlag(fs, &cfg.ApprovalTTL, "approval-ttl", cfg.ApprovalTTL, "how long approval requests stay pending")
	fs.Int64Var(&cfg.CreditsPerInvocation, "credits-per-invocation", cfg.CreditsPerInvocation, "the flat price of an invocation")
	durationFlag(fs, &cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "close an API connection idle this long between requests")
	durationFlag(fs, &cfg.HeaderTimeout, "header-timeout", cfg.HeaderTimeout, "close an API connection whose request headers take longer")
	durationFlag(fs, &cfg.BodyTimeout, "body-timeout", cfg.BodyTimeout, "refuse a request whose body takes longer after its headers (not the wait for the answer)")
	durationFlag(fs, &cfg.WriteTimeout, "write-timeout", cfg.WriteTimeout, "close an API connection whose client takes longer to take one write of an answer")
	fs.IntVar(&cfg.MaxConnections, "max-connections", cfg.MaxConnections, "API connections open at once; more are closed as soon as accepted")
	durationFlag(fs, &cfg.MCP.ApprovalWait, "mcp-approval-wait", cfg.MCP.ApprovalWait, "how long an MCP tool call waits for an approval when the client cannot show its page")
	fs.IntVar(&cfg.MCP.MaxSessionsPerKey, "mcp-max-sessions-per-key", cfg.MCP.MaxSessionsPerKey, "the MCP sessions of /mcp one key keeps open at once (one more ends its oldest), and its stateless requests in flight (one more is refused)")
	fs.StringVar(&cfg.MCP.ApprovalURL, "mcp-approval-url", cfg.MCP.ApprovalURL, "the page of approval {id} that MCP clients are shown, relative to the daemon's URL unless absolute")
	analyticsFlags(fs, &cfg.Analytics)
	sessionFlags(fs, &cfg.Sessions)
	fs.StringVar(&cfg.E2B.Listen, "e2b-listen", cfg.E2B.Listen, "serve the E2B SDKs' wire (control plane and sandboxes) on this address; empty: off")
	fs.BoolVar(&cfg.BehindTLS, "behind-tls", cfg.BehindTLS, "clients reach the daemon through a proxy that terminates TLS: the console's cookies are marked Secure")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "log lines on stderr: text or json (default text)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "the least level logged: debug, info, warn or error (default info)")
	return fs, cfg, load
}

func serve(ctx context.Context, listen, db string, cfg config.Config) error {
	log := newLogger(cfg.LogFormat, cfg.LogLevel)
	// What logs through slog's default (the engine's pools) logs so too.
	slog.SetDefault(log)
	// Traces, when the OTEL_* variables ask for them (docs/telemetry.md);
	// the spans still buffered are sent as the daemon stops.
	stopTracing, err := telemetry.Setup(ctx, os.Getenv, version)
	if err != nil {
		return usageError{err}
	}
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := stopTracing(flushCtx); err != nil {
			log.Warn("sending the last spans", "err", err)
		}
	}()
	if telemetry.Enabled(os.Getenv) {
		log.Info("tracing on: OTLP over HTTP", "endpoint", telemetry.Endpoint(os.Getenv))
	}
	// SIGUSR2 stops the daemon for good: its sessions end first. It is
	// caught before the daemon opens its store or any sandbox: one sent
	// while the daemon starts (whose default action would kill it) stops
	// it so once it serves. (One sent while the flags are parsed, before
	// any session can exist, still kills it.)
	forGood := make(chan os.Signal, 1)
	signal.Notify(forGood, syscall.SIGUSR2)
	defer signal.Stop(forGood)
	mcpOpts := mcp.Options{ApprovalWait: cfg.MCP.ApprovalWait, ApprovalURL: cfg.MCP.ApprovalURL, Version: version}
	if err := mcpOpts.Validate(); err != nil {
		return usageError{err}
	}
	if cfg.MCP.MaxSessionsPerKey < 0 {
		return usagef("mcp.max_sessions_per_key must not be negative, got %d", cfg.MCP.MaxSessionsPerKey)
	}
	release, err := claimHost(cfg)
	if err != nil {
		return err
	}
	defer release()
	eng, err := wiring.Engine(cfg)
	if err != nil {
		return classify(err)
	}
	if err := checkDrivers(ctx, eng, log); err != nil {
		return classify(err)
	}
	if db == "" {
		db = storeopen.DefaultURL(cfg.DataDir)
	}
	if err := os.MkdirAll(cfg.DataDir, fsmode.Traverse); err != nil {
		return err
	}
	wit := witness.Dir(cmp.Or(cfg.AuditWitness, witness.Default(db)))
	if err := fixModes(cfg, string(wit)); err != nil {
		return err
	}
	st, err := storeopen.OpenWith(ctx, db, storeopen.Options{AnalyticsOutbox: cfg.Analytics.Enabled()})
	if err != nil {
		return classify(fmt.Errorf("opening database: %w", err))
	}
	defer st.Close()
	metrics := api.NewMetrics()
	svc := capability.NewService(eng, st, capability.ServiceOptions{
		CreditsPerInvocation: new(cfg.CreditsPerInvocation), ApprovalTTL: cfg.ApprovalTTL,
		MaxConcurrent: cfg.MaxConcurrent, MaxQueue: cfg.MaxQueue, Observer: metrics, Logger: log,
		Owner: owner(cfg.StateDir), Witness: wit, Sessions: sessionOptions(cfg.Sessions, cfg.CheckpointDir()),
		Snapshots: capability.SnapshotOptions{TTL: cfg.Sessions.SnapshotTTL, MaxForks: cfg.Sessions.MaxForks,
			MaxCheckpointBytes: int64(cfg.Sessions.MaxCheckpointBytes)},
	})
	if err := svc.Start(ctx); err != nil {
		return err
	}
	defer func() {
		// ctx has ended by then: the service's last waits and writes get
		// a bound of their own.
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		if err := svc.Close(closeCtx); err != nil {
			log.Warn("closing the service", "err", err)
		}
	}()
	// The pools fill once the service has reaped what a crashed daemon
	// left (Start), and their sandboxes carry its owner label, so that the
	// next daemon reaps them in turn.
	eng.SetPoolObserver(metrics)
	stopPools, err := eng.StartPools(ctx, map[string]string{engine.LabelOwner: owner(cfg.StateDir)})
	if err != nil {
		return classify(err)
	}
	defer stopPools()
	// The daemon holds its image store, so that no prune by hand removes
	// a build its sandboxes run, and prunes it itself: now, once its
	// sessions are re-attached and its pools started, and after each
	// template build.
	imgs := image.Open(cfg.ImageDir())
	unhold, err := imgs.Hold()
	if err != nil {
		return classify(err)
	}
	defer unhold()
	pruner := templatejobs.Pruner{Store: imgs, Engine: eng, Logger: log, Keep: func() []string { return wiring.PausedImages(cfg.CheckpointDir()) }}
	if err := pruner.Prune(); err != nil {
		log.Error("pruning the image store", "err", err)
	}
	// The service holds the database's daemon claim from Start to Close:
	// the shipper runs inside that span (deferred after Close, it stops
	// before it).
	stopShipping, err := shipAnalytics(ctx, st, cfg.Analytics, metrics, log)
	if err != nil {
		return err
	}
	defer stopShipping()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return usageError{fmt.Errorf("listening on %s: %w", listen, err)}
	}
	// Requests get a context that ends when shutdown begins, so that long
	// polls and event streams end instead of holding Shutdown for its whole
	// grace period.
	reqCtx, endRequests := context.WithCancel(context.WithoutCancel(ctx))
	defer endRequests()
	// No ReadTimeout or WriteTimeout: they would bound the whole exchange
	// and cut long polls and event streams. The handler bounds the body
	// and each write instead.
	ui := console.New(svc, st, console.Options{Witness: wit, SecureCookies: cfg.BehindTLS, Logger: log})
	// Builds still running when the daemon stops are cancelled (deferred
	// before the store closes); the previous builds serve on.
	jobs, err := templateJobs(cfg, eng, st, pruner.Prune, log)
	if err != nil {
		return classify(err)
	}
	defer jobs.Close()
	srv := &http.Server{
		Handler: api.New(svc, st, api.Options{Metrics: metrics, UI: ui, BodyTimeout: cfg.BodyTimeout, WriteTimeout: cfg.WriteTimeout, MCP: mcpOpts,
			MCPSessionsPerKey: cfg.MCP.MaxSessionsPerKey, Logger: log, Templates: jobs}),
		IdleTimeout: cfg.IdleTimeout, ReadHeaderTimeout: cfg.HeaderTimeout,
		BaseContext: func(net.Listener) context.Context { return reqCtx },
	}
	// The E2B wire (e2b.listen), off by default; its interpreter is
	// mounted here once package e2b has one (e2b.NewInterpreter).
	stopE2B, err := serveE2B(reqCtx, cfg, db, svc, st, log)
	if err != nil {
		return err
	}
	defer stopE2B()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(api.LimitListener(ln, cfg.MaxConnections, metrics)) }()
	log.Info("stockade serving", "listen", ln.Addr().String(), "db", redact(db), "default_driver", eng.DefaultDriver())
	endSessions := cfg.Sessions.OnShutdown == config.OnShutdownEnd
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	case <-forGood:
		endSessions = true
	}
	sessions := config.OnShutdownKeep
	if endSessions {
		sessions = config.OnShutdownEnd
	}
	log.Info("shutting down", "sessions", sessions)
	// Deferred, the sessions end once the API has stopped taking requests
	// (below) and before the service closes (deferred before).
	defer func() {
		if endSessions {
			endAllSessions(ctx, svc, log)
		}
	}()
	endRequests()
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		// Handlers still running after the grace period are cut off
		// before the service and the store close under them.
		_ = srv.Close()
	}
	return nil
}

// closeTimeout bounds the service's Close: its runs, cancelled, recording
// their ends, their sandboxes' networks removed, its last writes.
const closeTimeout = time.Minute

// endSessionsTimeout bounds the ending of a stopping daemon's sessions; a
// session it has not ended by then ends by itself after its ttl.
const endSessionsTimeout = 2 * time.Minute

// endAllSessions ends every session of svc, for a daemon stopped for good
// (sessions.on_shutdown: end, or SIGUSR2), once no request comes in any
// more and before the service closes.
func endAllSessions(ctx context.Context, svc *capability.Service, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endSessionsTimeout)
	defer cancel()
	n, err := svc.EndSessions(ctx)
	if err != nil {
		log.Error("ending the sessions at shutdown; those left end by themselves after their ttl", "ended", n, "err", err)
		return
	}
	log.Info("ended the sessions at shutdown", "ended", n)
}

// analyticsFlags registers the serve flags of a, over its values.
func analyticsFlags(fs *flag.FlagSet, a *config.Analytics) {
	fs.StringVar(&a.ClickHouse.URL, "analytics-clickhouse-url", a.ClickHouse.URL, "ship tool_invocations rows to this ClickHouse HTTP interface (env STOCKADE_ANALYTICS_CLICKHOUSE_URL; default none)")
	fs.StringVar(&a.ClickHouse.Database, "analytics-clickhouse-database", a.ClickHouse.Database, "ClickHouse database of the rows, created if missing")
	fs.StringVar(&a.ClickHouse.Table, "analytics-clickhouse-table", a.ClickHouse.Table, "ClickHouse table of the rows, created if missing")
	durationFlag(fs, &a.ClickHouse.Timeout, "analytics-clickhouse-timeout", a.ClickHouse.Timeout, "bound of each request to ClickHouse")
	fs.IntVar(&a.BatchSize, "analytics-batch-size", a.BatchSize, "rows sent to ClickHouse at once")
	durationFlag(fs, &a.Interval, "analytics-interval", a.Interval, "pause between two rounds of shipping to ClickHouse")
	fs.Int64Var(&a.Outbox.MaxRows, "analytics-outbox-max-rows", a.Outbox.MaxRows, "rows waiting for ClickHouse at most; past it the oldest are dropped")
	durationFlag(fs, &a.Outbox.MaxAge, "analytics-outbox-max-age", a.Outbox.MaxAge, "how long a row waits for ClickHouse at most; past it it is dropped")
}

// shipAnalytics starts shipping the store's analytics outbox to ClickHouse
// when a is enabled, until ctx ends or stop is called; stop then runs a
// last round (bounded to a few seconds), so that a daemon that stops
// leaves nothing behind that ClickHouse could take. Rows of executions
// that end after it are shipped by the next daemon.
func shipAnalytics(ctx context.Context, st analytics.Outbox, a config.Analytics, obs analytics.Observer, log *slog.Logger) (stop func(), err error) {
	if !a.Enabled() {
		return func() {}, nil
	}
	sink, err := analytics.NewClickHouse(wiring.ClickHouseConfig(a))
	if err != nil {
		return nil, usageError{err}
	}
	opts := wiring.ShipperOptions(a)
	opts.Observer, opts.Logger = obs, log
	sh := analytics.NewShipper(st, sink, opts)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sh.Run(runCtx)
	}()
	log.Info("shipping tool_invocations rows to ClickHouse", "sink", sink.String(), "batch_size", a.BatchSize,
		"interval", a.Interval.String(), "outbox_max_rows", a.Outbox.MaxRows, "outbox_max_age", a.Outbox.MaxAge.String())
	return func() {
		cancel()
		<-done
		last, cancelLast := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancelLast()
		_ = sh.Ship(last)
	}, nil
}

// selfTester is a driver that can prove it runs sandboxes by starting one
// (ocidriver.Driver.SelfTest); its answer becomes the driver's health.
type selfTester interface {
	SelfTest(ctx context.Context) error
}

// checkDrivers has every driver prove that it can run sandboxes: by a
// self-test where the driver has one, else by its health. A daemon whose
// default driver cannot refuses to start rather than failing every
// invocation; another driver that cannot is logged, and stays unhealthy
// (on /healthz, and 503 driver_unavailable for its tools) until it can.
func checkDrivers(ctx context.Context, eng *engine.Engine, log *slog.Logger) error {
	drivers := eng.Drivers()
	for _, name := range slices.Sorted(maps.Keys(drivers)) {
		var err error
		switch d := drivers[name].(type) {
		case selfTester:
			err = d.SelfTest(ctx)
		case sandbox.HealthChecker:
			err = d.Health(ctx)
		}
		switch {
		case err == nil:
		case name == eng.DefaultDriver():
			return fmt.Errorf("default driver %s: %w", name, err)
		default:
			log.Warn("driver unavailable; its tools are refused until it works", "driver", name, "err", err)
		}
	}
	return nil
}

// claimHost locks what a daemon owns on its host besides its database (which
// the service claims): its state directory, whose sandboxes it reaps at
// start (they carry its owner label), and with egress its sandbox networks'
// prefix, whose networks it removes at start. A second daemon sharing
// either would destroy the first one's sandboxes or networks; it is refused
// instead, naming what to change.
func claimHost(cfg config.Config) (release func(), err error) {
	type claim struct{ dir, name, what string }
	claims := []claim{{cfg.StateDir, "daemon.lock", fmt.Sprintf("the state directory %s (state_dir in the configuration)", cfg.StateDir)}}
	if cfg.Egress && os.Geteuid() == 0 {
		// Without root the engine gives no sandbox egress (and removes no
		// network), so there is no prefix to own.
		prefix := cfg.EgressPrefix
		if prefix == "" {
			prefix = config.DefaultEgressPrefix
		}
		claims = append(claims, claim{filepath.Dir(netns.UserRunDir), "egress-" + prefix + ".lock",
			fmt.Sprintf("the sandbox network prefix %q (egress_prefix and egress_range in the configuration, or --egress=false)", prefix)})
	}
	var releases []func() error
	release = func() {
		for _, r := range releases {
			r()
		}
	}
	for _, c := range claims {
		if err := os.MkdirAll(c.dir, 0o700); err != nil {
			release()
			return nil, err
		}
		r, err := flock.TryLock(filepath.Join(c.dir, c.name))
		if errors.Is(err, flock.ErrHeld) {
			err = usagef("another stockade daemon on this host uses %s; stop it first, or give this one its own", c.what)
		}
		if err != nil {
			release()
			return nil, err
		}
		releases = append(releases, r)
	}
	return release, nil
}

// redact hides a password in a database URL for logs.
func redact(db string) string {
	if u, err := url.Parse(db); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			return u.Redacted()
		}
	}
	return db
}

// owner names this daemon's sandboxes: daemons with different state
// directories (sharing one Docker engine, say) never reap each other's.
func owner(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return "stockade-" + hex.EncodeToString(sum[:6])
}

// sessionFlags registers the serve flags of s, over its values.
func sessionFlags(fs *flag.FlagSet, s *config.Sessions) {
	durationFlag(fs, &s.IdleTimeout, "sessions-idle-timeout", s.IdleTimeout, "a session no cell ran in for so long ends (idle_timeout)")
	durationFlag(fs, &s.MaxIdleTimeout, "sessions-max-idle-timeout", s.MaxIdleTimeout, "the most idle_timeout_ms a session may ask for")
	durationFlag(fs, &s.TTL, "sessions-ttl", s.TTL, "a session ends so long after it opened (ttl)")
	durationFlag(fs, &s.MaxTTL, "sessions-max-ttl", s.MaxTTL, "the most ttl_ms a session may ask for")
	fs.IntVar(&s.MaxPerWorkspace, "sessions-max-per-workspace", s.MaxPerWorkspace, "live sessions of a workspace at most (a workspace policy's max_sessions may lower it)")
	fs.Var(&s.WorkspaceSize, "sessions-workspace-size", "size of a session's /workspace tmpfs, e.g. 256MiB")
	fs.Var(&s.MaxWorkspaceSize, "sessions-max-workspace-size", "ceiling of sessions.workspace_size")
	fs.Var(&s.MaxFileSize, "sessions-max-file-size", "largest file moved into or out of a session, e.g. 64MiB")
	fs.StringVar(&s.OnShutdown, "sessions-on-shutdown", s.OnShutdown, "keep: a stopped daemon leaves its sessions running for the next start (each ends by itself after its ttl; those on a driver that cannot re-attach, docker and kubernetes, end at every stop); end: it ends them first (SIGUSR2 ends them whatever this says)")
	durationFlag(fs, &s.PauseAfterIdle, "sessions-pause-after-idle", s.PauseAfterIdle, "pause a session no cell ran in for so long instead of ending it (gvisor; 0: off)")
	fs.StringVar(&s.CheckpointDir, "sessions-checkpoint-dir", s.CheckpointDir, "directory of paused sessions' checkpoints (default DATA_DIR/checkpoints)")
	fs.IntVar(&s.MaxForks, "sessions-max-forks", s.MaxForks, "the most sessions one fork starts (0: the default, 16)")
	durationFlag(fs, &s.SnapshotTTL, "sessions-snapshot-ttl", s.SnapshotTTL, "how long a session's snapshot is kept unless deleted (0: the default, 24h)")
	fs.Var(&s.MaxCheckpointBytes, "sessions-max-checkpoint-bytes", "the disk a workspace's snapshots and paused sessions may hold before snapshots are refused (0: the default, 4GiB)")
	fs.Int64Var(&s.CreditsPerSessionHour, "sessions-credits-per-session-hour", s.CreditsPerSessionHour, "credits charged per hour of a session besides its cells (only 0 is supported)")
}

// sessionOptions are the service's bounds of sessions from s.
func sessionOptions(s config.Sessions, checkpoints string) capability.SessionOptions {
	return capability.SessionOptions{IdleTimeout: s.IdleTimeout, MaxIdleTimeout: s.MaxIdleTimeout, TTL: s.TTL, MaxTTL: s.MaxTTL,
		MaxPerWorkspace: s.MaxPerWorkspace, WorkspaceSize: int64(s.WorkspaceSize), MaxFileSize: int64(s.MaxFileSize),
		CheckpointDir: checkpoints, PauseAfterIdle: s.PauseAfterIdle}
}

// sizeValue is a flag holding a size (sandbox.ParseSize).
type sizeValue int64

func (v *sizeValue) String() string {
	if v == nil || *v == 0 {
		return ""
	}
	return sandbox.FormatSize(int64(*v))
}

func (v *sizeValue) Set(s string) error {
	n, err := sandbox.ParseSize(s)
	if err != nil {
		return err
	}
	*v = sizeValue(n)
	return nil
}

// newLogger is the daemon's logger on stderr: format text (the default)
// or json, from level (debug, info: the default, warn, error), as
// config.Validate checked them.
func newLogger(format, level string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(cmp.Or(level, "info")))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
