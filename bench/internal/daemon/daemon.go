// Package daemon runs the capability layer and the HTTP API over an
// engine in the benchmark's process, as `stockade serve` does, with one
// workspace whose policy needs no approval, and calls it as its agent: so
// that the benchmarks time what a client of the daemon sees.
//
//	c, stop, err := daemon.Serve(ctx, eng, "/tmp/bench.db", "bench-x", 1000)
//	defer stop()
//	id, err := c.Session()
package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/wire"
)

// Binaries builds the stockade binary into dir, for the shim of the
// drivers' detached sandboxes (sessions), and installs the guest there;
// it returns the drivers' Shim and GuestPath. It runs `go build`, from
// the module's root.
func Binaries(dir string) (shim []string, guest string, err error) {
	bin := filepath.Join(dir, "stockade")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/stockade").CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("building the shim (run from the module root): %v\n%s", err, out)
	}
	guest, err = guestbin.Install(filepath.Join(dir, "bin"))
	return []string{bin, "shim"}, guest, err
}

// Drivers are a benchmark's runc and gVisor drivers, with the shim and
// the guest of Binaries, over state directories of their own.
type Drivers struct {
	Runc   *ocidriver.Driver
	Gvisor *ocidriver.Snapshotting
	// Shim is the drivers' shim command, the stockade binary first.
	Shim []string
	// State holds the drivers' state directories, State/runc and
	// State/gvisor.
	State string
}

// NewDrivers builds the binaries into dir (Binaries) and opens the
// drivers over a new temporary directory under stateDir; remove removes
// that directory, once the drivers' sandboxes are gone.
func NewDrivers(dir, stateDir string) (ds Drivers, remove func(), err error) {
	shim, guest, err := Binaries(dir)
	if err != nil {
		return Drivers{}, nil, err
	}
	state, err := os.MkdirTemp(stateDir, "stockade-bench-")
	if err != nil {
		return Drivers{}, nil, err
	}
	ds = Drivers{Shim: shim, State: state}
	if ds.Runc, err = runc.New(runc.Config{StateDir: filepath.Join(state, "runc"), GuestPath: guest, Shim: shim}); err == nil {
		ds.Gvisor, err = gvisor.New(gvisor.Config{StateDir: filepath.Join(state, "gvisor"), GuestPath: guest, Shim: shim})
	}
	if err != nil {
		os.RemoveAll(state)
		return Drivers{}, nil, err
	}
	return ds, func() { os.RemoveAll(state) }, nil
}

// Serve starts a daemon over eng with its SQLite store at db (and its
// paused sessions' checkpoints beside it), its sandboxes labelled with
// owner, and a workspace with credits, and returns its agent client and
// a function that stops it (and waits for eng). It listens on 127.0.0.1
// only. It is ServeWith with no Options.
func Serve(ctx context.Context, eng *engine.Engine, db, owner string, credits int64) (Client, func(), error) {
	return ServeWith(ctx, eng, db, owner, credits, Options{})
}

// Options are what a benchmark's daemon allows beyond the capability
// layer's defaults. The engine's own bounds, such as its memory budget
// (engine.WithMemoryBudget), are set where eng is made.
type Options struct {
	// MaxSessions is the workspace's session quota
	// (capability.SessionOptions.MaxPerWorkspace); 0 keeps its default.
	// When set, the client keeps up to twice as many idle connections,
	// so that sessions running cells at once each keep theirs between
	// cells instead of dialling again.
	MaxSessions int
}

// ServeWith is Serve with the bounds of opts.
func ServeWith(ctx context.Context, eng *engine.Engine, db, owner string, credits int64, opts Options) (Client, func(), error) {
	st, err := storeopen.Open(ctx, "sqlite:"+db)
	if err != nil {
		return Client{}, nil, err
	}
	fail := func(err error) (Client, func(), error) {
		st.Close()
		return Client{}, nil, err
	}
	ws, err := st.CreateWorkspace(ctx, "bench", nil)
	if err != nil {
		return fail(err)
	}
	key := "sk_bench_" + rand.Text()
	if _, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey(key), Name: "bench"}); err != nil {
		return fail(err)
	}
	p, err := st.GetPolicy(ctx, ws.ID)
	if err != nil {
		return fail(err)
	}
	p.Approval = model.ApprovalNone
	if _, err := st.SetPolicy(ctx, ws.ID, p, nil); err != nil {
		return fail(err)
	}
	if _, err := st.GrantCredits(ctx, ws.ID, credits, "benchmark", nil); err != nil {
		return fail(err)
	}
	sessions := capability.SessionOptions{MaxPerWorkspace: opts.MaxSessions, CheckpointDir: strings.TrimSuffix(db, filepath.Ext(db)) + "-checkpoints"}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	svc := capability.NewService(eng, st, capability.ServiceOptions{Owner: owner, Sessions: sessions, Logger: log})
	if err := svc.Start(ctx); err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		svc.Close(context.WithoutCancel(ctx))
		return fail(err)
	}
	srv := &http.Server{Handler: api.New(svc, st, api.Options{Logger: log}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	stop := func() {
		srv.Close()
		svc.Close(context.WithoutCancel(ctx))
		eng.Wait(context.WithoutCancel(ctx))
		st.Close()
	}
	hc := &http.Client{}
	if opts.MaxSessions > 0 {
		hc.Transport = &http.Transport{MaxIdleConnsPerHost: 2 * opts.MaxSessions, IdleConnTimeout: time.Minute}
	}
	return Client{ctx: context.Background(), base: "http://" + ln.Addr().String(), key: key, http: hc}, stop, nil
}

// Client calls the daemon with the agent key. Its requests are bound to
// its context (none for Serve's client; see WithContext).
type Client struct {
	ctx       context.Context
	base, key string
	http      *http.Client
}

// WithContext returns a copy of c whose requests are bound to ctx: they
// fail once it is done.
func (c Client) WithContext(ctx context.Context) Client {
	c.ctx = ctx
	return c
}

// Session creates a python session and returns its id.
func (c Client) Session() (string, error) {
	var ses wire.Session
	err := c.Post("/v1/sessions", capability.CreateSessionRequest{Runtime: "python"}, http.StatusCreated, &ses)
	return ses.ID, err
}

// EndSession ends session id.
func (c Client) EndSession(id string) error {
	return c.Do(http.MethodDelete, "/v1/sessions/"+id, nil, http.StatusOK, nil)
}

// Cell runs code as a cell of session id and checks that it succeeds
// with stdout want (not checked when want is empty).
func (c Client) Cell(id, code, want string) error {
	var v wire.Cell
	if err := c.Post("/v1/sessions/"+id+"/exec", capability.CellRequest{Code: code}, http.StatusOK, &v); err != nil {
		return err
	}
	if v.Status != "succeeded" || want != "" && v.Stdout != want {
		return fmt.Errorf("cell %q: got status %s, stdout %q, stderr %q; want succeeded, %q", code, v.Status, v.Stdout, v.Stderr, want)
	}
	return nil
}

// OneShot returns a Run of the one-shot python run of code, which must
// print want.
func (c Client) OneShot(code, want string) func() error {
	return func() error {
		var v wire.Execution
		if err := c.Post("/v1/executions", capability.InvokeRequest{Runtime: "python", Code: code}, http.StatusOK, &v); err != nil {
			return err
		}
		var res struct {
			Stdout string `json:"stdout"`
		}
		if v.Status != "succeeded" || json.Unmarshal(v.Result.JSON(), &res) != nil || res.Stdout != want {
			return fmt.Errorf("one-shot %q: got %s %s", code, v.Status, v.Result)
		}
		return nil
	}
}

// Post is Do with POST.
func (c Client) Post(path string, body any, want int, out any) error {
	return c.Do(http.MethodPost, path, body, want, out)
}

// Do sends body as JSON (none when nil) and decodes the answer, which
// must have status want, into out (when not nil).
func (c Client) Do(method, path string, body any, want int, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(c.ctx, method, c.base+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}
