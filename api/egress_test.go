package api_test

// End-to-end tests of egress through the API: an agent asks for network
// for a tool whose record has an egress allowlist, an approver decides over
// HTTP, the sandbox reaches a loopback upstream by name through its own
// DNS responder and the egress proxy, and the proxy's refusals end up in
// the workspace's audit trail. They need root: each sandbox with network
// gets a network namespace with nftables rules. No traffic leaves the host
// for anything but the test's loopback upstream.

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
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// The sandbox networks of these tests have a prefix and a range of their
// own, apart from the daemon's default and from the engine's and
// internal/netns's tests, which go test may run at the same time.
const egressPrefix = "stka"

var egressRange = netip.MustParsePrefix("10.213.192.0/20")

// allowedName is the one name of the tool's allowlist. The proxy's test
// override resolves it to the loopback upstream.
const allowedName = "allowed.test"

// noResolver answers no name: only the override resolves, so that no
// question of a sandbox can reach a real resolver.
type noResolver struct{}

func (noResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, errors.New("no resolver in tests")
}

// egressEnv is an env whose engine can give sandboxes egress, with a tool
// "fetch" allowed to reach an HTTP upstream on loopback.
type egressEnv struct {
	*env
	eng  *engine.Engine
	nets *netns.Manager
	// port is the upstream's port, the one port of fetch's allowlist;
	// hits counts the requests the upstream answered.
	port int
	hits *atomic.Int64
}

// newEgressEnv returns an egressEnv whose fetch tool runs on driver ("runc"
// or "gvisor"). The workspace's policy permits network and needs no
// approval, so that any approval asked for is the network's. Its cleanup
// fails the test if a sandbox network is left behind.
//
// opts edit the env's configuration (sessions: the drivers get the shim
// of detached sandboxes).
func newEgressEnv(t *testing.T, b backend, driver string, opts ...func(*envConfig)) *egressEnv {
	t.Helper()
	tier := map[string]sandbox.Tier{"runc": sandbox.TierContainer, "gvisor": sandbox.TierGVisor}[driver]
	if tier == sandbox.TierGVisor {
		testenv.RequiresBinary(t, "runsc")
	}
	hits := &atomic.Int64{}
	es := newEgressSetup(t, egressPrefix, egressRange, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "upstream saw %s%s", r.Host, r.URL.Path)
	}, func(port int) string {
		return fmt.Sprintf(`
tools:
  - name: fetch
    input_trust: trusted
    tier: %s
    runtimes: [python]
    egress:
      allow: [%s]
      ports: [%d]
`, tier, allowedName, port)
	}, nil)
	nets, port, set, topts, host := es.nets, es.port, es.set, es.topts, es.host
	c := envConfig{
		credits: 10,
		policy: func(p *model.Policy) {
			noApproval(p)
			p.NetworkAllowed = true
		},
		engine: []engine.Option{engine.WithTools(set, topts), engine.WithEgress(host)},
	}
	for _, o := range opts {
		o(&c)
	}
	if tier == sandbox.TierGVisor {
		gc := gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)}
		if c.sessions {
			gc.Shim = testenv.Shim(t)
		}
		g, err := gvisor.New(gc)
		if err != nil {
			t.Fatal(err)
		}
		c.drivers = map[string]sandbox.Driver{"gvisor": g}
	}
	e := newEnv(t, b, c)
	return &egressEnv{env: e, eng: e.svc.Runner(), nets: nets, port: port, hits: hits}
}

// egressSetup is what an env whose sandboxes have egress is made of: an
// upstream on loopback, reached by the name allowedName at port; the
// sandbox networks; the tools; the egress host (proxy, broker).
type egressSetup struct {
	nets  *netns.Manager
	port  int
	url   string // the upstream's
	set   *tools.Set
	topts tools.Options
	host  *engine.EgressHost
}

// newEgressSetup starts an upstream serving h, a network manager of
// prefix and rng (checked for leftovers when the test ends, after the
// service registered later closes), the tools toolsYAML(port) declares,
// and an egress host whose resolver gives allowedName the loopback
// address and whose broker is brokerOf(the upstream's URL) (nil for
// none).
func newEgressSetup(t *testing.T, prefix string, rng netip.Prefix, h http.HandlerFunc, toolsYAML func(port int) string, brokerOf func(url string) *broker.Config) *egressSetup {
	t.Helper()
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	port := up.Listener.Addr().(*net.TCPAddr).Port
	nets, err := netns.NewManager(netns.Config{Prefix: prefix, Range: rng})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nets.CleanupStale(); err != nil {
		t.Fatalf("removing the networks an earlier run left: %v", err)
	}
	// Registered before newEnv registers the service's Close, so it runs
	// after it: Close waits for the networks' removal.
	t.Cleanup(func() {
		if left := nets.Leftovers(); len(left) > 0 {
			t.Errorf("left behind: %v", left)
			_, _ = nets.CleanupStale()
			_, _ = nets.RemoveKept(nil) // a session's network
		}
	})
	path := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(path, []byte(toolsYAML(port)), 0o600); err != nil {
		t.Fatal(err)
	}
	topts := tools.Options{EgressSupported: true, Drivers: wiring.DriverCapabilities(config.Default()), DefaultTier: sandbox.TierContainer}
	set, err := tools.Load(path, topts)
	if err != nil {
		t.Fatal(err)
	}
	var bc *broker.Config
	if brokerOf != nil {
		bc = brokerOf(up.URL)
	}
	host, err := engine.NewEgressHost(nets, egress.Config{
		Resolver:     noResolver{},
		TestOverride: egress.NewTestOverride(t, map[string][]netip.Addr{allowedName: {netip.MustParseAddr("127.0.0.1")}}),
	}, bc)
	if err != nil {
		t.Fatal(err)
	}
	return &egressSetup{nets: nets, port: port, url: up.URL, set: set, topts: topts, host: host}
}

// fetchCode is the sandbox's program, as fetchCode % port. It reaches the
// upstream only by the allowed name; then tries another name and the IP
// address of the host end of its veth (its resolv.conf's nameserver, where
// the proxy listens).
const fetchCode = `
import urllib.request
port = %d
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]
host = ns[0] if ns else "127.0.0.1"
def attempt(label, url):
    try:
        print(label, "OK", urllib.request.urlopen(url, timeout=5).read().decode())
    except Exception as e:
        print(label, "FAILED", type(e).__name__)
attempt("allowed", "http://allowed.test:%%d/x" %% port)
attempt("other-name", "http://other.test:%%d/x" %% port)
attempt("direct-ip", "http://%%s:%%d/x" %% (host, port))
`

// fetchRequest is the agent's request: fetch's program with network.
func (e *egressEnv) fetchRequest() capability.InvokeRequest {
	return capability.InvokeRequest{Runtime: "python", Tool: "fetch", Network: "allow", Code: fmt.Sprintf(fetchCode, e.port)}
}

// wantFetchCard checks that an approval card shows the approver where the
// sandbox may go: fetch's allowlist and port.
func (e *egressEnv) wantFetchCard(raw json.RawMessage) {
	e.t.Helper()
	var c capability.ApprovalCard
	if err := json.Unmarshal(raw, &c); err != nil {
		e.t.Fatalf("approval card %s: %v", raw, err)
	}
	if c.Network != "allow" || c.Tool != "fetch" || !slices.Equal(c.EgressAllow, []string{allowedName}) || !slices.Equal(c.EgressPorts, []int{e.port}) {
		e.t.Errorf("approval card: got network %q tool %q allow %v ports %v, want network for fetch to %s on %d",
			c.Network, c.Tool, c.EgressAllow, c.EgressPorts, allowedName, e.port)
	}
}

// wantNoNetworks waits for the engine's removal of sandbox networks and
// checks that none is left.
func (e *egressEnv) wantNoNetworks() {
	e.t.Helper()
	if err := e.eng.Wait(context.Background()); err != nil {
		e.t.Errorf("removing the sandbox networks: %v", err)
	}
	if left := e.nets.Leftovers(); len(left) > 0 {
		e.t.Errorf("left behind: %v", left)
	}
}

// refusal is what a test expects of one egress.denied event.
type refusal struct {
	reason, protocol, name string // name empty: any
}

// egressData is the data of an egress.denied event.
type egressData struct {
	Tool     string `json:"tool"`
	Protocol string `json:"protocol"`
	Name     string `json:"name"`
	Port     int    `json:"port"`
}

// waitRefusals lists the egress.denied events of execution id over HTTP
// until there is one matching each of want, and fails the test if that
// takes more than 10 s. The service writes them from a queue, so they may
// land after the execution has ended.
func (e *egressEnv) waitRefusals(id string, want ...refusal) []wire.AuditEvent {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs := e.events("egress.denied", id)
		var missing []refusal
		for _, w := range want {
			if !slices.ContainsFunc(evs, func(ev wire.AuditEvent) bool {
				var d egressData
				return json.Unmarshal(ev.Data, &d) == nil && ev.Reason == w.reason && d.Protocol == w.protocol && (w.name == "" || d.Name == w.name)
			}) {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			return evs
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("egress.denied events of %s: got %s, want ones matching %+v", id, eventSummary(evs), missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func eventSummary(evs []wire.AuditEvent) string {
	var out []string
	for _, ev := range evs {
		out = append(out, fmt.Sprintf("{%s %q %s}", ev.Type, ev.Reason, ev.Data))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// TestEgressOverHTTP runs an approved network request through the API on
// each driver: the request is held for approval although the workspace
// needs none, the card shows the allowlist, and once an approver approves
// it the sandbox reaches the upstream by the allowed name and nothing else;
// the refusals are audit events of the execution, the chain verifies, one
// invocation is charged, and no sandbox network is left.
func TestEgressOverHTTP(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		for _, driver := range []string{"runc", "gvisor"} {
			t.Run(driver, func(t *testing.T) {
				e := newEgressEnv(t, b, driver)
				req := e.fetchRequest()
				v := e.awaitApproval(req)
				e.wantFetchCard(cardJSON(v.Approval))
				pending := list[wire.Approval](t, e.url, e.approver, "/v1/approvals", "status=pending")
				if len(pending) != 1 || pending[0].ID != v.ApprovalID {
					t.Fatalf("pending approvals: got %+v, want %s", pending, v.ApprovalID)
				}
				e.wantFetchCard(cardJSON(&pending[0].Card))
				if n := e.hits.Load(); n != 0 {
					t.Fatalf("the upstream answered %d requests before the approval, want 0", n)
				}

				e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, map[string]string{"reason": "fetch may reach " + allowedName}).
					want(t, http.StatusOK)
				got := e.wait(v.ID, 50*time.Second) // under requestTimeout; the run itself is bounded at 30 s
				if string(got.Status) != string(model.StatusSucceeded) || got.Driver != driver {
					t.Fatalf("after approval: got status %q on %q, result %s; want succeeded on %s", got.Status, got.Driver, got.Result, driver)
				}
				res := result(t, got)
				for _, want := range []string{
					fmt.Sprintf("allowed OK upstream saw %s:%d/x", allowedName, e.port),
					"other-name FAILED",
					"direct-ip FAILED",
				} {
					if !strings.Contains(res.Stdout, want) {
						t.Errorf("stdout lacks %q:\nstdout %s\nstderr %s", want, res.Stdout, res.Stderr)
					}
				}
				if n := e.hits.Load(); n != 1 {
					t.Errorf("the upstream answered %d requests, want 1 (the allowed fetch)", n)
				}
				e.wantNoNetworks()

				denied := e.waitRefusals(v.ID,
					refusal{egress.ReasonNameNotAllowed, string(egress.ProtoDNS), "other.test"},
					refusal{egress.ReasonIPLiteral, string(egress.ProtoHTTP), ""})
				for _, ev := range denied {
					var d egressData
					if err := json.Unmarshal(ev.Data, &d); err != nil || ev.Code != "EGR001W" || ev.Actor != "system" || d.Tool != "fetch" || d.Name == allowedName {
						t.Errorf("egress.denied event: got %s by %q with code %s (%v), want EGR001W by system for fetch, never %s",
							eventSummary([]wire.AuditEvent{ev}), ev.Actor, ev.Code, err, allowedName)
					}
				}
				allowed := e.events("capability.invoke_allowed", v.ID)
				var data struct {
					ApprovalRequired bool `json:"approval_required"`
				}
				if len(allowed) != 1 || json.Unmarshal(allowed[0].Data, &data) != nil || !data.ApprovalRequired {
					t.Errorf("invoke_allowed events: got %s, want one with approval_required", eventSummary(allowed))
				}
				for _, typ := range []string{"approval.requested", "approval.approved"} {
					if n := len(e.events(typ, v.ID)); n != 1 {
						t.Errorf("%s events: got %d, want 1", typ, n)
					}
				}
				if ok, broken, err := e.st.VerifyChain(t.Context(), e.ws.ID); !ok || err != nil {
					t.Errorf("VerifyChain: ok %v broken %+v err %v", ok, broken, err)
				}
				if tc := e.toolCall(v.ID); tc.Tool != "fetch" || tc.Status != "succeeded" || tc.CreditsCharged != 2 {
					t.Errorf("tool_calls row: got tool %q %s with %d credits, want fetch succeeded with 2", tc.Tool, tc.Status, tc.CreditsCharged)
				}
				e.wantCredits(8, 0)
			})
		}
	})
}

// TestEgressNeedsApproval checks that a network request never runs
// without a human: while it waits nothing is prepared, and denied it ends
// without a sandbox, a network or a single request to the upstream, and is
// not charged.
func TestEgressNeedsApproval(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEgressEnv(t, b, "runc")
		v := e.awaitApproval(e.fetchRequest())
		e.wantFetchCard(cardJSON(v.Approval))
		if got := e.wait(v.ID, time.Second); string(got.Status) != string(model.StatusAwaitingApproval) || got.StartedAt != nil {
			t.Fatalf("while pending: got status %q started %v, want awaiting_approval, not started", got.Status, got.StartedAt)
		}
		if left := e.nets.Leftovers(); len(left) > 0 {
			t.Errorf("networks while the approval is pending: %v, want none", left)
		}

		e.deny(t, v, "no network")
		if n := e.hits.Load(); n != 0 {
			t.Errorf("the upstream answered %d requests, want 0", n)
		}
		e.wantNoNetworks()
		if evs := e.events("egress.denied", v.ID); len(evs) != 0 {
			t.Errorf("egress.denied events: got %s, want none (nothing ran)", eventSummary(evs))
		}
		if n := len(e.events("approval.denied", v.ID)); n != 1 {
			t.Errorf("approval.denied events: got %d, want 1", n)
		}
		if ok, broken, err := e.st.VerifyChain(t.Context(), e.ws.ID); !ok || err != nil {
			t.Errorf("VerifyChain: ok %v broken %+v err %v", ok, broken, err)
		}
		e.wantCredits(10, 0)
	})
}
