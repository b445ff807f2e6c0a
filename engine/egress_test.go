package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/sqlite"
	"github.com/stockade-sh/stockade/tools"
)

// failResolver resolves nothing: in tests only the override's names exist.
type failResolver struct{}

func (failResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, errors.New("no resolver in tests")
}

// Test sandbox networks use their own prefix and range, apart from the
// daemon's and from internal/netns's tests.
const egressTestPrefix = "stke"

var egressTestRange = netip.MustParsePrefix("10.213.224.0/20")

func writeTools(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNetworkRequestsNeedApproval checks the service's gate for network
// requests: denied on a tool without an allowlist, and held for approval
// on one with an allowlist even when the workspace needs no approval.
func TestNetworkRequestsNeedApproval(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(t.TempDir(), "db.sqlite")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ws, err := st.CreateWorkspace(ctx, "net")
	if err != nil {
		t.Fatal(err)
	}
	pol := store.DefaultPolicy()
	pol.Approval = store.ApprovalNone
	pol.NetworkAllowed = true
	if _, err := st.SetPolicy(ctx, ws.ID, pol); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GrantCredits(ctx, ws.ID, 100, "test"); err != nil {
		t.Fatal(err)
	}
	key := func(role store.Role) Principal {
		k, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: role, Hash: store.HashKey(string(role))})
		if err != nil {
			t.Fatal(err)
		}
		return Principal{KeyID: k.ID, WorkspaceID: ws.ID, Role: role}
	}
	agent, approver := key(store.RoleAgent), key(store.RoleApprover)

	opts := tools.Options{EgressSupported: true}
	set, err := tools.Load(writeTools(t, fetchYAML("allowed.test")), opts)
	if err != nil {
		t.Fatal(err)
	}
	nets, err := netns.NewManager(netns.Config{Prefix: egressTestPrefix, Range: egressTestRange})
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := egress.New(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	drv := &fakeDriver{name: "gvisor", tier: sandbox.TierGVisor}
	newSvc := func(t *testing.T, o ...Option) *Service {
		eng, err := New(map[string]sandbox.Driver{"gvisor": drv}, "gvisor", fakeImages{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling(), append(o, WithTools(set, opts))...)
		if err != nil {
			t.Fatal(err)
		}
		svc := NewService(eng, st, ServiceOptions{})
		if err := svc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(svc.Close)
		return svc
	}

	t.Run("allowlisted tool needs approval", func(t *testing.T) {
		svc := newSvc(t, WithEgress(nets, proxy, nil))
		inv, err := svc.Invoke(ctx, agent, InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "fetch", Network: "allow"}, InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if inv.Approval == nil || inv.Execution.Status != store.StatusAwaitingApproval {
			t.Fatalf("got status %s approval %v, want awaiting approval with approval none", inv.Execution.Status, inv.Approval)
		}
		var card ApprovalCard
		if err := json.Unmarshal(inv.Approval.Card, &card); err != nil {
			t.Fatal(err)
		}
		if !card.NetworkRequested || card.Tool != "fetch" || strings.Join(card.EgressAllow, ",") != "allowed.test" || len(card.EgressPorts) != 1 || card.EgressPorts[0] != 443 {
			t.Errorf("card %+v, want the network request and fetch's allowlist", card)
		}
		// Approved, it runs with network: the fake driver cannot give
		// egress, which proves the stored request's network reached the
		// engine.
		if _, _, err := svc.Decide(ctx, approver, inv.Approval.ID, true, "ok"); err != nil {
			t.Fatal(err)
		}
		e, err := svc.Wait(ctx, agent, inv.Execution.ID, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if e.Status != store.StatusLaunchFailed || !strings.Contains(string(e.Result), "cannot give a sandbox egress") {
			t.Errorf("got %s %s, want launch_failed because the fake driver has no egress", e.Status, e.Result)
		}
	})
	t.Run("without network no approval", func(t *testing.T) {
		svc := newSvc(t, WithEgress(nets, proxy, nil))
		inv, err := svc.Invoke(ctx, agent, InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "fetch"}, InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if inv.Approval != nil {
			t.Errorf("got an approval request for a request without network")
		}
		if _, err := svc.Wait(ctx, agent, inv.Execution.ID, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("refusals are audited", func(t *testing.T) {
		svc := newSvc(t, WithEgress(nets, proxy, nil))
		const exec = "ex_refused"
		svc.wsMu.Lock()
		svc.workspaces[exec] = ws.ID
		svc.wsMu.Unlock()
		svc.egressDecision(EgressDecision{Decision: egress.Decision{Reason: egress.ReasonNameNotAllowed, Sandbox: "sbx-1", Tool: "fetch", Name: "evil.test", Port: 443},
			Labels: map[string]string{LabelExecution: exec}})
		svc.Close()
		page, err := st.ListEvents(ctx, ws.ID, store.EventFilter{PageRequest: store.PageRequest{Limit: 10}, Types: []string{audit.EgressDenied}})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) != 1 || page.Items[0].Reason != egress.ReasonNameNotAllowed || page.Items[0].Code != audit.EgressDeniedCode || page.Items[0].ExecutionID != exec {
			t.Errorf("got events %+v, want one egress.denied for %s", page.Items, exec)
		}
	})
	for _, tt := range []struct {
		name, tool string
		o          []Option
		want       string
	}{
		{"default tool denied", "", []Option{WithEgress(nets, proxy, nil)}, "has none"},
		{"no egress on the host", "fetch", nil, "not available on this server"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			svc := newSvc(t, tt.o...)
			_, err := svc.Invoke(ctx, agent, InvokeRequest{Runtime: "python", Code: "print(1)", Tool: tt.tool, Network: "allow"}, InvokeOptions{})
			if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want permission denied with %q", err, tt.want)
			}
		})
	}
}

// egressScript runs in the sandbox. It reaches the upstream only by name,
// through the sandbox's own DNS responder and proxy, and otherwise only
// the host end of its own veth (the resolv.conf's nameserver).
const egressScript = `
import urllib.request
port = %d
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]
host = ns[0] if ns else "127.0.0.1"
def attempt(label, f):
    try:
        print(label, "OK", f())
    except Exception as e:
        print(label, "FAILED", type(e).__name__)
def get(url, **headers):
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5).read().decode()
attempt("allowed", lambda: get("http://allowed.test:%%d/x" %% port))
attempt("other-name", lambda: get("http://other.test:%%d/x" %% port))
attempt("other-host-header", lambda: get("http://%%s:%%d/x" %% (host, port), Host="other.test"))
attempt("direct-ip", lambda: get("http://%%s:%%d/x" %% (host, port)))
`

// TestEgressOnBothTiers runs a tool with an egress allowlist through
// engine.Run with network on runc and gvisor: the allowed name reaches a
// loopback upstream (through the test override), another name and a
// direct IP do not, refusals carry the run's labels, and nothing of the
// sandbox networks is left.
func TestEgressOnBothTiers(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	testenv.RequiresBinary(t, "runsc")
	testenv.Image(t, "python")
	guest := testenv.Guest(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "upstream saw %s%s", r.Host, r.URL.Path)
	}))
	defer up.Close()
	upPort := up.Listener.Addr().(*net.TCPAddr).Port

	nets, err := netns.NewManager(netns.Config{Prefix: egressTestPrefix, Range: egressTestRange})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nets.CleanupStale(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if left := nets.Leftovers(); len(left) > 0 {
			t.Errorf("left behind: %v", left)
			_, _ = nets.CleanupStale()
		}
	})
	var eng *Engine
	proxy, err := egress.New(egress.Config{
		Resolver:     failResolver{},
		TestOverride: egress.NewTestOverride(t, map[string][]netip.Addr{"allowed.test": {netip.MustParseAddr("127.0.0.1")}}),
		OnDecision:   func(d egress.Decision) { eng.EgressDecision(d) },
	})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: guest})
	if err != nil {
		t.Fatal(err)
	}
	gv, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: guest})
	if err != nil {
		t.Fatal(err)
	}
	opts := tools.Options{EgressSupported: true}
	set, err := tools.Load(writeTools(t, fmt.Sprintf(`
tools:
  - name: fetch
    input_trust: trusted
    tier: gvisor
    runtimes: [python]
    egress:
      allow: [allowed.test]
      ports: [%d]
`, upPort)), opts)
	if err != nil {
		t.Fatal(err)
	}
	eng, err = New(map[string]sandbox.Driver{"runc": rc, "gvisor": gv}, "gvisor", image.Open(testenv.DataDir()),
		sandbox.DefaultLimits(), sandbox.DefaultCeiling(), WithTools(set, opts), WithEgress(nets, proxy, nil))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var refused []EgressDecision
	eng.SetEgressObserver(func(d EgressDecision) {
		if !d.Allowed {
			mu.Lock()
			refused = append(refused, d)
			mu.Unlock()
		}
	})

	for _, drv := range []string{"runc", "gvisor"} {
		t.Run(drv, func(t *testing.T) {
			mu.Lock()
			refused = nil
			mu.Unlock()
			exec := "ex_egress_" + drv
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, err := eng.Run(ctx, Request{Tool: "fetch", Driver: drv, Runtime: "python", Network: true,
				Code: []byte(fmt.Sprintf(egressScript, upPort)), Labels: map[string]string{LabelExecution: exec}})
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				fmt.Sprintf("allowed OK upstream saw allowed.test:%d/x", upPort),
				"other-name FAILED",
				"other-host-header FAILED",
				"direct-ip FAILED",
			} {
				if !strings.Contains(res.Stdout, want) {
					t.Errorf("output lacks %q:\nstdout %s\nstderr %s", want, res.Stdout, res.Stderr)
				}
			}
			if left := nets.Leftovers(); len(left) > 0 {
				t.Errorf("after the run, left behind: %v", left)
			}
			mu.Lock()
			defer mu.Unlock()
			reasons := map[string]bool{}
			for _, d := range refused {
				if d.Labels[LabelExecution] != exec {
					t.Errorf("refusal %+v lacks the run's labels", d)
				}
				reasons[d.Reason] = true
			}
			for _, want := range []string{egress.ReasonNameNotAllowed, egress.ReasonIPLiteral} {
				if !reasons[want] {
					t.Errorf("refusals %+v lack %q", refused, want)
				}
			}
		})
	}
	t.Run("without network", func(t *testing.T) {
		res, err := eng.Run(context.Background(), Request{Tool: "fetch", Driver: "runc", Runtime: "python",
			Code: []byte(fmt.Sprintf(egressScript, upPort))})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(res.Stdout, "allowed FAILED") || strings.Contains(res.Stdout, "upstream saw") {
			t.Errorf("got %s %s, want no network without Network", res.Stdout, res.Stderr)
		}
	})
}
