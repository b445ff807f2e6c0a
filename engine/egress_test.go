package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/clip"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// mapResolver resolves only its names, and records every name it is
// asked for: in tests no query may leave for a real resolver, and a name
// the DNS responder refused must never reach it. The proxy asks for
// absolute names; the map and the record hold them without the final dot.
type mapResolver struct {
	names map[string][]netip.Addr
	// hang is a name whose lookup lasts until its context ends.
	hang string

	mu      sync.Mutex
	queries []string
}

func (r *mapResolver) LookupNetIP(ctx context.Context, _, host string) ([]netip.Addr, error) {
	host = strings.TrimSuffix(host, ".")
	r.mu.Lock()
	r.queries = append(r.queries, host)
	r.mu.Unlock()
	if host == r.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if as, ok := r.names[host]; ok {
		return as, nil
	}
	return nil, errors.New("no resolver in tests")
}

func (r *mapResolver) asked(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.queries, name)
}

// Test sandbox networks use their own prefix and range, apart from the
// daemon's and from internal/netns's tests.
const egressTestPrefix = "stke"

var egressTestRange = netip.MustParsePrefix("10.213.224.0/20")

func writeTools(t testing.TB, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// pythonFetch is the tools file of a python tool "fetch" on tier whose
// egress allowlist is allow on ports.
func pythonFetch(tier string, allow []string, ports ...int) string {
	ps := make([]string, len(ports))
	for i, p := range ports {
		ps[i] = strconv.Itoa(p)
	}
	return fmt.Sprintf(`
tools:
  - name: fetch
    input_trust: trusted
    tier: %s
    runtimes: [python]
    egress:
      allow: [%s]
      ports: [%s]
`, tier, strings.Join(allow, ", "), strings.Join(ps, ", "))
}

// runFetch runs code as tool fetch with network on driver drv, labelled as
// execution exec.
func (env *egressEnv) runFetch(t *testing.T, drv, exec string, code []byte) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := env.eng.Run(ctx, Request{Tool: "fetch", Driver: drv, Runtime: "python", Network: true,
		Code: code, Labels: map[string]string{LabelExecution: exec}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestNetworkRequestsNeedApproval checks the service's gate for network
// requests: denied on a tool without an allowlist, and held for approval
// on one with an allowlist even when the workspace needs no approval.
func TestNetworkRequestsNeedApproval(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	ws, err := st.CreateWorkspace(ctx, "net", nil)
	if err != nil {
		t.Fatal(err)
	}
	pol := store.DefaultPolicy()
	pol.Approval = store.ApprovalNone
	pol.NetworkAllowed = true
	if _, err := st.SetPolicy(ctx, ws.ID, pol, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GrantCredits(ctx, ws.ID, 100, "test", nil); err != nil {
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

	opts := tools.Options{EgressSupported: true, Drivers: DriverCapabilities()}
	set, err := tools.Load(writeTools(t, fetchYAML("allowed.test")), opts)
	if err != nil {
		t.Fatal(err)
	}
	nets, err := netns.NewManager(netns.Config{Prefix: egressTestPrefix, Range: egressTestRange})
	if err != nil {
		t.Fatal(err)
	}
	host, err := NewEgressHost(nets, egress.Config{}, nil)
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
		svc := newSvc(t, WithEgress(host))
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
		if card.Network != "allow" || card.Tool != "fetch" || strings.Join(card.EgressAllow, ",") != "allowed.test" || len(card.EgressPorts) != 1 || card.EgressPorts[0] != 443 {
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
		svc := newSvc(t, WithEgress(host))
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
		svc := newSvc(t, WithEgress(host))
		const exec = "ex_refused"
		svc.startRun(exec, ws.ID)
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
	t.Run("broker calls are audited", func(t *testing.T) {
		svc := newSvc(t, WithEgress(host))
		const exec = "ex_broker"
		svc.startRun(exec, ws.ID)
		labels := map[string]string{LabelExecution: exec}
		svc.brokerCall(BrokerEvent{Event: broker.Event{Sandbox: "sbx-2", Tool: "fetch", Operation: "echo", ParamsSHA256: "abc", Allowed: true, Status: 200}, Labels: labels})
		svc.brokerCall(BrokerEvent{Event: broker.Event{Sandbox: "sbx-2", Tool: "fetch", Operation: "other", Reason: "operation not in the tool's record"}, Labels: labels})
		svc.Close()
		for _, want := range []struct{ typ, code, reason string }{
			{audit.BrokerCall, audit.BrokerCallCode, "operation echo answered 200"},
			{audit.BrokerDenied, audit.BrokerDeniedCode, "operation not in the tool's record"},
		} {
			page, err := st.ListEvents(ctx, ws.ID, store.EventFilter{PageRequest: store.PageRequest{Limit: 10}, Types: []string{want.typ}})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Items) != 1 || page.Items[0].Reason != want.reason || page.Items[0].Code != want.code || page.Items[0].ExecutionID != exec ||
				!strings.Contains(string(page.Items[0].Data), `"params_sha256"`) {
				t.Errorf("%s events: got %+v, want one with reason %q", want.typ, page.Items, want.reason)
			}
		}
	})
	t.Run("refusals are bounded", func(t *testing.T) {
		svc := newSvc(t, WithEgress(host))
		const exec = "ex_flood"
		svc.startRun(exec, ws.ID)
		huge := strings.Repeat("a", 60000) + ".test"
		labels := map[string]string{LabelExecution: exec}
		for range maxRefusalEvents - 1 {
			svc.egressDecision(EgressDecision{Decision: egress.Decision{Reason: egress.ReasonNameNotAllowed, Sandbox: "sbx-3", Tool: "fetch", Name: huge, Port: 443, Detail: huge},
				Labels: labels})
		}
		// A refusal quoting what the sandbox sent, past the store's bound on
		// a reason: it is audited, cut.
		svc.brokerCall(BrokerEvent{Event: broker.Event{Sandbox: "sbx-3", Tool: "fetch", Operation: huge,
			Reason: fmt.Sprintf("operation %q is not in tool %q's credentials", huge, "fetch")}, Labels: labels})
		for range 50 {
			svc.egressDecision(EgressDecision{Decision: egress.Decision{Reason: egress.ReasonNameNotAllowed, Sandbox: "sbx-3", Tool: "fetch", Name: huge, Port: 443},
				Labels: labels})
		}
		svc.endRun(exec)
		svc.Close()
		events := func(typ string) []store.Event {
			page, err := st.ListEvents(ctx, ws.ID, store.EventFilter{PageRequest: store.PageRequest{Limit: 500}, Types: []string{typ}, ExecutionID: exec})
			if err != nil {
				t.Fatal(err)
			}
			return page.Items
		}
		denied := events(audit.EgressDenied)
		if len(denied) != maxRefusalEvents-1 {
			t.Errorf("egress.denied events: got %d, want %d", len(denied), maxRefusalEvents-1)
		}
		for _, ev := range denied {
			if len(ev.Data) > 2048 {
				t.Fatalf("an egress.denied event carries %d bytes of data, want the name and detail cut", len(ev.Data))
			}
		}
		if b := events(audit.BrokerDenied); len(b) != 1 || len(b[0].Reason) > 2*clip.Reason || len(b[0].Data) > 2048 {
			t.Errorf("broker.denied events: got %d (%+v), want one, cut", len(b), b)
		}
		sup := events(audit.RefusalsSuppressed)
		if len(sup) != 1 || !strings.Contains(string(sup[0].Data), `"suppressed":50`) {
			t.Errorf("egress.refusals_suppressed events: got %+v, want one counting 50", sup)
		}
	})
	for _, tt := range []struct {
		name, tool string
		o          []Option
		want       string
	}{
		{"default tool denied", "", []Option{WithEgress(host)}, "has none"},
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

// egressEnv is an engine with runc and gvisor and real sandbox networks,
// whose proxy reaches loopback upstreams through a test override.
type egressEnv struct {
	eng      *Engine
	nets     *netns.Manager
	resolver *mapResolver
	// logs holds what the proxy logs, as the daemon's log would (Info).
	logs *syncBuffer

	mu      sync.Mutex
	refused []EgressDecision
}

// newEgressEnv builds an egressEnv over the tools of toolsYAML. override
// maps names to loopback upstreams; resolve is what the proxy's resolver
// answers for other names (addresses it must refuse); b is the broker, or
// nil. Its cleanup waits for the sandbox networks' removal and fails the
// test if anything is left.
func newEgressEnv(tb testing.TB, toolsYAML string, override, resolve map[string][]netip.Addr, b *broker.Config) *egressEnv {
	tb.Helper()
	testenv.RequiresRoot(tb)
	testenv.RequiresBinary(tb, "runc")
	testenv.RequiresBinary(tb, "runsc")
	testenv.Image(tb, "python")
	guest := testenv.Guest(tb)
	env := &egressEnv{resolver: &mapResolver{names: resolve}, logs: &syncBuffer{}}
	nets, err := netns.NewManager(netns.Config{Prefix: egressTestPrefix, Range: egressTestRange})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := nets.CleanupStale(); err != nil {
		tb.Fatal(err)
	}
	env.nets = nets
	tb.Cleanup(func() {
		if env.eng != nil {
			if err := env.eng.Wait(); err != nil {
				tb.Error(err)
			}
		}
		if left := nets.Leftovers(); len(left) > 0 {
			tb.Errorf("left behind: %v", left)
			_, _ = nets.CleanupStale()
		}
	})
	host, err := NewEgressHost(nets, egress.Config{
		Resolver:     env.resolver,
		TestOverride: egress.NewTestOverride(tb, override),
		Logger:       slog.New(slog.NewTextHandler(env.logs, nil)),
	}, b)
	if err != nil {
		tb.Fatal(err)
	}
	rc, err := runc.New(runc.Config{StateDir: tb.TempDir(), GuestPath: guest})
	if err != nil {
		tb.Fatal(err)
	}
	gv, err := gvisor.New(gvisor.Config{StateDir: tb.TempDir(), GuestPath: guest})
	if err != nil {
		tb.Fatal(err)
	}
	opts := tools.Options{EgressSupported: true, Drivers: DriverCapabilities()}
	set, err := tools.Load(writeTools(tb, toolsYAML), opts)
	if err != nil {
		tb.Fatal(err)
	}
	env.eng, err = New(map[string]sandbox.Driver{"runc": rc, "gvisor": gv}, "gvisor", image.Open(testenv.DataDir()),
		sandbox.DefaultLimits(), sandbox.DefaultCeiling(), WithTools(set, opts), WithEgress(host))
	if err != nil {
		tb.Fatal(err)
	}
	env.eng.SetEgressObserver(func(d EgressDecision) {
		if !d.Allowed {
			env.mu.Lock()
			env.refused = append(env.refused, d)
			env.mu.Unlock()
		}
	})
	return env
}

// takeRefused returns the refusals observed so far and forgets them.
func (env *egressEnv) takeRefused() []EgressDecision {
	env.mu.Lock()
	defer env.mu.Unlock()
	r := env.refused
	env.refused = nil
	return r
}

// egressScript runs in the sandbox as SCRIPT % (http port, https port, udp
// port). It reaches the upstreams only by name, through the sandbox's own
// DNS responder and proxy, and otherwise only the host end of its own
// veth (the resolv.conf's nameserver).
const egressScript = `
import os, socket, ssl, urllib.request
port, tls_port, udp_port = %d, %d, %d
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]
host = ns[0] if ns else "127.0.0.1"
def attempt(label, f):
    try:
        print(label, "OK", f())
    except Exception as e:
        print(label, "FAILED", type(e).__name__)
def get(url, **headers):
    ctx = ssl._create_unverified_context()
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5, context=ctx).read().decode()
attempt("allowed", lambda: get("http://allowed.test:%%d/x" %% port))
attempt("https-allowed", lambda: get("https://allowed.test:%%d/y" %% tls_port))
attempt("other-name", lambda: get("http://other.test:%%d/x" %% port))
attempt("other-host-header", lambda: get("http://%%s:%%d/x" %% (host, port), Host="other.test"))
attempt("direct-ip", lambda: get("http://%%s:%%d/x" %% (host, port)))
attempt("rebind", lambda: get("http://rebind.test:%%d/x" %% port))
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1); s.sendto(b"ping", (host, udp_port)); return s.recv(64)
attempt("udp", udp)
def v6():
    s = socket.socket(socket.AF_INET6); s.settimeout(1); s.connect(("fe80::1%%eth0", port)); return "connected"
attempt("ipv6", v6)
label = os.urandom(8).hex() + ".test"
print("random-label", label)
attempt("random-dns", lambda: socket.getaddrinfo(label, port))
print("uid_map", " ".join(open("/proc/self/uid_map").read().split()))
`

// TestEgressOnBothTiers runs a tool with an egress allowlist through
// engine.Run with network on runc and gvisor: the allowed name reaches
// loopback upstreams over HTTP and HTTPS (SNI, through the test override);
// another name, a direct IP, a name that resolves to loopback (DNS
// rebinding), UDP to the host, IPv6 and a random DNS label do not; the
// random label reaches no resolver; each refusal reaches the engine's
// observer with its reason and the run's labels, and nothing of the
// sandbox networks is left.
func TestEgressOnBothTiers(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "upstream saw %s%s", r.Host, r.URL.Path)
	}))
	defer up.Close()
	upPort := up.Listener.Addr().(*net.TCPAddr).Port
	tlsUp := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls upstream saw %s%s", r.Host, r.URL.Path)
	}))
	defer tlsUp.Close()
	tlsPort := tlsUp.Listener.Addr().(*net.TCPAddr).Port
	// A UDP echo on every host address, the sandbox's host end included:
	// were UDP let through, the sandbox would get its answer.
	udp, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	udpPort := udp.LocalAddr().(*net.UDPAddr).Port
	var udpSeen sync.WaitGroup
	var udpPackets atomic.Int64
	udpSeen.Go(func() {
		buf := make([]byte, 64)
		for {
			n, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			udpPackets.Add(1)
			_, _ = udp.WriteTo(buf[:n], from)
		}
	})
	defer udpSeen.Wait()
	defer udp.Close()

	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	env := newEgressEnv(t, pythonFetch("gvisor", []string{"allowed.test", "rebind.test"}, upPort, tlsPort),
		map[string][]netip.Addr{"allowed.test": loop}, map[string][]netip.Addr{"rebind.test": loop}, nil)
	script := []byte(fmt.Sprintf(egressScript, upPort, tlsPort, udpPort))

	for _, drv := range []string{"runc", "gvisor"} {
		t.Run(drv, func(t *testing.T) {
			env.takeRefused()
			exec := "ex_egress_" + drv
			res := env.runFetch(t, drv, exec, script)
			t.Logf("sandbox output:\n%s%s", res.Stdout, res.Stderr)
			for _, want := range []string{
				fmt.Sprintf("allowed OK upstream saw allowed.test:%d/x", upPort),
				fmt.Sprintf("https-allowed OK tls upstream saw allowed.test:%d/y", tlsPort),
				"other-name FAILED",
				"other-host-header FAILED",
				"direct-ip FAILED",
				"rebind FAILED",
				"udp FAILED",
				"ipv6 FAILED",
				"random-dns FAILED gaierror",
			} {
				if !strings.Contains(res.Stdout, want) {
					t.Errorf("output lacks %q:\nstdout %s\nstderr %s", want, res.Stdout, res.Stderr)
				}
			}
			var label string
			for l := range strings.Lines(res.Stdout) {
				if rest, ok := strings.CutPrefix(l, "random-label "); ok {
					label = strings.TrimSpace(rest)
				}
			}
			if label == "" {
				t.Fatalf("the script printed no random label:\n%s", res.Stdout)
			}
			if env.resolver.asked(label) {
				t.Errorf("the random label %s reached the resolver", label)
			}
			if drv == "runc" {
				// A user namespace of the sandbox's own, which owns its
				// network namespace: root and the sandbox user map to a
				// slot of host ids, nothing else is mapped.
				var uidMap string
				for l := range strings.Lines(res.Stdout) {
					if strings.HasPrefix(l, "uid_map ") {
						uidMap = l
					}
				}
				var base, next uint32
				if _, err := fmt.Sscanf(uidMap, "uid_map 0 %d 1 65534 %d 1\n", &base, &next); err != nil || base < sandbox.FirstHostID || next != base+1 {
					t.Errorf("runc sandbox with egress: %q, want root and 65534 mapped to a slot of host ids (%v)", uidMap, err)
				}
			}
			if !env.resolver.asked("rebind.test") {
				t.Errorf("rebind.test was never resolved; the rebinding check proved nothing")
			}
			if n := udpPackets.Load(); n != 0 {
				t.Errorf("the host's UDP echo got %d packets from the sandbox, want 0", n)
			}
			if err := env.eng.Wait(); err != nil {
				t.Error(err)
			}
			if left := env.nets.Leftovers(); len(left) > 0 {
				t.Errorf("after the run, left behind: %v", left)
			}
			type key struct {
				reason, name string
				proto        egress.Protocol
			}
			got := map[key]bool{}
			reasons := map[string]bool{}
			for _, d := range env.takeRefused() {
				if d.Labels[LabelExecution] != exec {
					t.Errorf("refusal %+v lacks the run's labels", d)
				}
				got[key{d.Reason, d.Name, d.Protocol}] = true
				reasons[d.Reason] = true
			}
			if !got[key{egress.ReasonNameNotAllowed, label, egress.ProtoDNS}] {
				t.Errorf("no DNS refusal of the random label %s among %v", label, got)
			}
			if !got[key{egress.ReasonNameNotAllowed, "other.test", egress.ProtoDNS}] {
				t.Errorf("no DNS refusal of other.test among %v", got)
			}
			for _, want := range []string{egress.ReasonNameNotAllowed, egress.ReasonIPLiteral, egress.ReasonPrivateAddress} {
				if !reasons[want] {
					t.Errorf("refusals %v lack %q", got, want)
				}
			}
		})
	}
	t.Run("without network", func(t *testing.T) {
		res, err := env.eng.Run(context.Background(), Request{Tool: "fetch", Driver: "runc", Runtime: "python", Code: script})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(res.Stdout, "allowed FAILED") || strings.Contains(res.Stdout, "upstream saw") {
			t.Errorf("got %s %s, want no network without Network", res.Stdout, res.Stderr)
		}
	})
}

// TestRefusalFloodInTheLog has one execution flood the proxy and its DNS
// responder with refusals, some naming a 60,000-byte host, and reads the
// log the daemon would write (the proxy's lines and the service's, at
// Info): at most the refusals audited one by one and one line counting
// the rest, none of them long.
func TestRefusalFloodInTheLog(t *testing.T) {
	env := newEgressEnv(t, pythonFetch("container", []string{"allowed.test"}, 8080), nil, nil, nil)
	svc := NewService(env.eng, openSQLite(t), ServiceOptions{Logger: slog.New(slog.NewTextHandler(env.logs, nil))})
	const exec = "ex_flood"
	svc.startRun(exec, "ws_flood")
	res := env.runFetch(t, "runc", exec, []byte(`
import socket
host = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
for i in range(1000):
    try:
        socket.getaddrinfo("n%d.refused.test" % i, 80)
    except OSError:
        pass
request = b"GET / HTTP/1.1\r\nHost: " + b"a" * 60000 + b".test\r\n\r\n"
for i in range(200):
    try:
        with socket.create_connection((host, 8080), timeout=5) as s:
            s.sendall(request)
            s.recv(100)
    except OSError:
        pass
print("flooded")
`))
	if res.Stdout != "flooded\n" {
		t.Fatalf("got stdout %q, stderr %q", res.Stdout, res.Stderr)
	}
	svc.endRun(exec)
	log := env.logs.String()
	lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
	longest := 0
	for _, l := range lines {
		longest = max(longest, len(l))
	}
	m := regexp.MustCompile(`msg="refusals past the audited ones" execution=ex_flood count=(\d+)`).FindStringSubmatch(log)
	t.Logf("%d log lines, %d bytes, the longest %d bytes", len(lines), len(log), longest)
	if len(lines) > maxRefusalEvents+1 || longest > 2048 || m == nil {
		t.Errorf("got %d log lines (the longest %d bytes) and the count line %q; want at most %d lines of at most 2 KiB, the last counting the rest",
			len(lines), longest, m, maxRefusalEvents+1)
	}
	if m == nil {
		return
	}
	if n, _ := strconv.Atoi(m[1]); n < 2000 {
		t.Errorf("the count line counts %d refusals past the audited ones, want at least 2000 (1000 names, A and AAAA, and 200 requests)", n)
	}
}

// TestRequestInFlightAtTheEnd checks that a request the proxy is still
// deciding when its sandbox ends is decided, with the run's labels, before
// Run returns: the service audits a refusal under the run's execution only
// while the run is under way. The program sends its request and exits
// while the proxy waits for the name to resolve.
func TestRequestInFlightAtTheEnd(t *testing.T) {
	env := newEgressEnv(t, pythonFetch("container", []string{"slow.test"}, 8080), nil, nil, nil)
	env.resolver.hang = "slow.test"
	script := []byte(`
import socket, time
s = socket.create_connection(("slow.test", 8080), timeout=5)
s.sendall(b"GET /x HTTP/1.1\r\nHost: slow.test:8080\r\n\r\n")
time.sleep(0.3)
print("sent")
`)
	for _, drv := range []string{"runc", "gvisor"} {
		t.Run(drv, func(t *testing.T) {
			env.takeRefused()
			exec := "ex_inflight_" + drv
			res := env.runFetch(t, drv, exec, script)
			if res.Stdout != "sent\n" {
				t.Fatalf("got stdout %q, stderr %q", res.Stdout, res.Stderr)
			}
			if !env.resolver.asked("slow.test") {
				t.Fatal("the proxy never looked slow.test up: the request did not reach it")
			}
			refused := env.takeRefused()
			if len(refused) != 1 || refused[0].Name != "slow.test" || refused[0].Reason != egress.ReasonNoSuchName || refused[0].Labels[LabelExecution] != exec {
				t.Fatalf("refusals when Run returned: %+v; want slow.test (%s) with the run's labels", refused, egress.ReasonNoSuchName)
			}
		})
	}
}

// TestNewEgressHostOwnsTheCallbacks refuses a proxy or broker
// configuration that already sends its decisions or calls elsewhere: the
// host receives them, for the engine's observers, and another receiver
// would go unnoticed.
func TestNewEgressHostOwnsTheCallbacks(t *testing.T) {
	nets, err := netns.NewManager(netns.Config{Prefix: egressTestPrefix, Range: egressTestRange})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		pc   egress.Config
		bc   *broker.Config
		ok   bool
	}{
		{"proxy and broker", egress.Config{}, &broker.Config{}, true},
		{"proxy alone", egress.Config{}, nil, true},
		{"proxy with OnDecision", egress.Config{OnDecision: func(egress.Decision) {}}, nil, false},
		{"broker with OnAudit", egress.Config{}, &broker.Config{OnAudit: func(broker.Event) {}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, err := NewEgressHost(nets, tt.pc, tt.bc)
			switch {
			case tt.ok && (err != nil || h == nil):
				t.Errorf("got %v, want a host", err)
			case tt.ok && (h.broker != nil) != (tt.bc != nil):
				t.Errorf("broker: got %v, want one only when configured", h.broker)
			case !tt.ok && !errdefs.IsInvalidArgument(err):
				t.Errorf("got %v, want invalid argument", err)
			}
		})
	}
	if _, err := NewEgressHost(nil, egress.Config{}, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("without networks: got %v, want invalid argument", err)
	}
}
