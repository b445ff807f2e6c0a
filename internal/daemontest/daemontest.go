// Package daemontest runs a Stockade daemon inside a test: a real SQLite
// store, the real runc driver, the capability layer and the HTTP API on a
// loopback listener (with the connection cap of stockade serve), for the
// tests of the packages that talk to a daemon (client, mcp, the CLI's
// remote commands).
//
//	d := daemontest.Start(t, daemontest.Options{})
//	ws := d.Workspace(t, daemontest.NoApproval, 10)
//	c, _ := client.New(d.URL, ws.Agent)
package daemontest

import (
	"context"
	"crypto/rand"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// Options configure a daemon; zero fields are the daemon's defaults.
type Options struct {
	Service capability.ServiceOptions
	API     api.Options
	// MaxConnections caps the listener's connections; zero is 1024, as
	// stockade serve.
	MaxConnections int
}

// Daemon is a daemon serving on URL until the test ends.
type Daemon struct {
	URL     string
	Service *capability.Service
	Metrics *api.Metrics
	st      setup
}

// setup is what Workspace writes to the daemon's store.
type setup interface {
	CreateWorkspace(ctx context.Context, name string, audit func(model.Workspace) []model.NewEvent) (model.Workspace, error)
	CreateAPIKey(ctx context.Context, k store.NewAPIKey) (model.APIKey, error)
	GetPolicy(ctx context.Context, workspaceID string) (model.Policy, error)
	SetPolicy(ctx context.Context, workspaceID string, p model.Policy, audit func(model.Policy) []model.NewEvent) (model.Policy, error)
	GrantCredits(ctx context.Context, workspaceID string, amount int64, note string, audit []model.NewEvent) (model.Credits, error)
}

// Requires gates t on what real runc sandboxes need: root, runc and the
// python, node and shell images.
func Requires(t testing.TB) {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	for _, img := range []string{"python", "node", "shell"} {
		testenv.Image(t, img)
	}
}

// Start starts a daemon that lives as long as t.
func Start(t testing.TB, o Options) *Daemon {
	t.Helper()
	Requires(t)
	st, err := storeopen.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "stockade.db"))
	if err != nil {
		t.Fatalf("opening the store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatalf("runc.New: %v", err)
	}
	eng, err := engine.New(map[string]sandbox.Driver{"runc": d}, "runc", image.Open(testenv.DataDir()),
		sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatalf("engine.New: %v", err)
	}
	metrics := api.NewMetrics()
	so := o.Service
	so.Observer = metrics
	svc := capability.NewService(eng, st, so)
	if err := svc.Start(t.Context()); err != nil {
		t.Fatalf("Service.Start: %v", err)
	}
	t.Cleanup(func() { svc.Close(context.Background()) })
	ao := o.API
	ao.Metrics = metrics
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxConnections == 0 {
		o.MaxConnections = 1024
	}
	srv := &http.Server{Handler: api.New(svc, st, ao)}
	go srv.Serve(api.LimitListener(ln, o.MaxConnections, metrics))
	// Closing (not shutting down) ends long polls and streams at once;
	// it runs before the service closes (cleanups run last first).
	t.Cleanup(func() { srv.Close() })
	return &Daemon{URL: "http://" + ln.Addr().String(), Service: svc, Metrics: metrics, st: st}
}

// Workspace is a workspace of the daemon and a key of each role.
type Workspace struct {
	ID                     string
	Agent, Approver, Admin string
}

// NoApproval is a policy edit: invocations run without a human.
func NoApproval(p *model.Policy) { p.Approval = model.ApprovalNone }

// Workspace creates a workspace whose policy is the default edited by
// policy (nil keeps it), granted credits, with a key of each role.
func (d *Daemon) Workspace(t testing.TB, policy func(*model.Policy), credits int64) Workspace {
	t.Helper()
	ctx := t.Context()
	ws, err := d.st.CreateWorkspace(ctx, "ws-"+rand.Text()[:8], nil)
	if err != nil {
		t.Fatalf("CreateWorkspace: %v", err)
	}
	w := Workspace{ID: ws.ID}
	for _, k := range []struct {
		role model.Role
		dst  *string
	}{{model.RoleAgent, &w.Agent}, {model.RoleApprover, &w.Approver}, {model.RoleAdmin, &w.Admin}} {
		*k.dst = "sk_test_" + string(k.role) + "_" + rand.Text()
		if _, err := d.st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: k.role, Hash: model.HashKey(*k.dst), Name: string(k.role)}); err != nil {
			t.Fatalf("CreateAPIKey(%s): %v", k.role, err)
		}
	}
	if policy != nil {
		p, err := d.st.GetPolicy(ctx, ws.ID)
		if err != nil {
			t.Fatalf("GetPolicy: %v", err)
		}
		policy(&p)
		if _, err := d.st.SetPolicy(ctx, ws.ID, p, nil); err != nil {
			t.Fatalf("SetPolicy: %v", err)
		}
	}
	if credits > 0 {
		if _, err := d.st.GrantCredits(ctx, ws.ID, credits, "test grant", nil); err != nil {
			t.Fatalf("GrantCredits: %v", err)
		}
	}
	return w
}
