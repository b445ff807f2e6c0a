package e2b

import (
	"context"
	"crypto/rand"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// tiers are the drivers the interpreter's session tests run on.
var tiers = []string{"runc", "gvisor"}

// tierDaemon is a daemon on one driver for a test, as
// internal/daemontest's (which runs runc only): a SQLite store, the
// capability layer and the HTTP API on loopback.
type tierDaemon struct {
	URL     string
	Service *capability.Service
	st      store.Store
}

// startTier starts a daemon on tier's driver that lives as long as t.
func startTier(t testing.TB, tier string) *tierDaemon {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.Image(t, "python")
	st, err := storeopen.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "stockade.db"))
	if err != nil {
		t.Fatalf("opening the store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	var drv sandbox.Driver
	switch tier {
	case "runc":
		testenv.RequiresBinary(t, "runc")
		drv, err = runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	case "gvisor":
		testenv.RequiresBinary(t, "runsc")
		drv, err = gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	}
	if err != nil {
		t.Fatalf("%s: %v", tier, err)
	}
	eng, err := engine.New(map[string]sandbox.Driver{tier: drv}, tier, image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatalf("engine.New: %v", err)
	}
	svc := capability.NewService(eng, st, capability.ServiceOptions{})
	if err := svc.Start(t.Context()); err != nil {
		t.Fatalf("Service.Start: %v", err)
	}
	t.Cleanup(func() { svc.Close(context.Background()) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api.New(svc, st, api.Options{})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return &tierDaemon{URL: "http://" + ln.Addr().String(), Service: svc, st: st}
}

// tierWorkspace is a workspace's agent and approver keys.
type tierWorkspace struct{ Agent, Approver string }

// workspace creates a workspace whose policy is the default edited by
// policy (nil keeps it), granted credits, with an agent and an approver
// key.
func (d *tierDaemon) workspace(t testing.TB, policy func(*model.Policy), credits int64) tierWorkspace {
	t.Helper()
	ctx := t.Context()
	ws, err := d.st.CreateWorkspace(ctx, "ws-"+rand.Text()[:8], nil)
	if err != nil {
		t.Fatalf("CreateWorkspace: %v", err)
	}
	var w tierWorkspace
	for _, k := range []struct {
		role model.Role
		dst  *string
	}{{model.RoleAgent, &w.Agent}, {model.RoleApprover, &w.Approver}} {
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
	if _, err := d.st.GrantCredits(ctx, ws.ID, credits, "test grant", nil); err != nil {
		t.Fatalf("GrantCredits: %v", err)
	}
	return w
}

// noApproval is a policy edit: cells run without a human.
func noApproval(p *model.Policy) { p.Approval = model.ApprovalNone }
