package capability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/clip"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// The sandbox networks of this package's tests have their own prefix and
// range, apart from the daemon's and from the other packages' tests.
const egressTestPrefix = "stkc"

var egressTestRange = netip.MustParsePrefix("10.213.208.0/20")

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

// noResolver resolves no name: in tests no query may leave for a real
// resolver.
type noResolver struct{}

func (noResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, errors.New("no resolver in tests")
}

// newEgressEngine returns an engine with the real runc driver and real
// sandbox networks, over the tools of toolsYAML, and the buffer its egress
// proxy logs to (at Info, as the daemon's log). Its cleanup waits for the
// networks' removal and fails the test if anything is left.
func newEgressEngine(t *testing.T, toolsYAML string) (*engine.Engine, *testenv.Buffer) {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	testenv.Image(t, "python")
	nets, err := netns.NewManager(netns.Config{Prefix: egressTestPrefix, Range: egressTestRange})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nets.CleanupStale(); err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	host, err := engine.NewEgressHost(nets, egress.Config{Resolver: noResolver{}, Logger: slog.New(slog.NewTextHandler(logs, nil))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	opts := tools.Options{EgressSupported: true, Drivers: DriverCapabilities()}
	set, err := tools.Load(writeTools(t, toolsYAML), opts)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(map[string]sandbox.Driver{"runc": rc}, "runc", image.Open(testenv.DataDir()),
		sandbox.DefaultLimits(), sandbox.DefaultCeiling(), engine.WithTools(set, opts), engine.WithEgress(host))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := eng.Wait(context.Background()); err != nil {
			t.Error(err)
		}
		if left := nets.Leftovers(); len(left) > 0 {
			t.Errorf("left behind: %v", left)
			_, _ = nets.CleanupStale()
		}
	})
	return eng, logs
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
	pol := model.DefaultPolicy()
	pol.Approval = model.ApprovalNone
	pol.NetworkAllowed = true
	if _, err := st.SetPolicy(ctx, ws.ID, pol, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GrantCredits(ctx, ws.ID, 100, "test", nil); err != nil {
		t.Fatal(err)
	}
	key := func(role model.Role) Principal {
		k, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: role, Hash: model.HashKey(string(role))})
		if err != nil {
			t.Fatal(err)
		}
		return Principal{KeyID: k.ID, WorkspaceID: ws.ID, Role: role}
	}
	agent, approver := key(model.RoleAgent), key(model.RoleApprover)

	opts := tools.Options{EgressSupported: true, Drivers: DriverCapabilities()}
	set, err := tools.Load(writeTools(t, fetchYAML("allowed.test")), opts)
	if err != nil {
		t.Fatal(err)
	}
	nets, err := netns.NewManager(netns.Config{Prefix: egressTestPrefix, Range: egressTestRange})
	if err != nil {
		t.Fatal(err)
	}
	host, err := engine.NewEgressHost(nets, egress.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	newSvc := func(t *testing.T, o ...engine.Option) *Service {
		eng, err := engine.New(map[string]sandbox.Driver{"gvisor": drv}, "gvisor", sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling(), append(o, engine.WithTools(set, opts))...)
		if err != nil {
			t.Fatal(err)
		}
		svc := NewService(eng, st, ServiceOptions{})
		if err := svc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { svc.Close(context.Background()) })
		return svc
	}

	t.Run("allowlisted tool needs approval", func(t *testing.T) {
		svc := newSvc(t, engine.WithEgress(host))
		inv, err := svc.Invoke(ctx, agent, InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "fetch", Network: "allow"}, InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if inv.Approval == nil || inv.Execution.Status != model.StatusAwaitingApproval {
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
		if e.Status != model.StatusLaunchFailed || !strings.Contains(string(e.Result), "cannot give a sandbox egress") {
			t.Errorf("got %s %s, want launch_failed because the fake driver has no egress", e.Status, e.Result)
		}
	})
	t.Run("without network no approval", func(t *testing.T) {
		svc := newSvc(t, engine.WithEgress(host))
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
		svc := newSvc(t, engine.WithEgress(host))
		const exec = "ex_refused"
		svc.egress.startRun(exec, ws.ID, "")
		svc.egress.egressDecision(engine.EgressDecision{Decision: egress.Decision{Reason: egress.ReasonNameNotAllowed, Sandbox: "sbx-1", Tool: "fetch", Name: "evil.test", Port: 443},
			Labels: map[string]string{engine.LabelExecution: exec}})
		svc.Close(t.Context())
		page, err := st.ListEvents(ctx, ws.ID, store.EventFilter{PageRequest: store.PageRequest{Limit: 10}, Types: []string{audit.EgressDenied}})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) != 1 || page.Items[0].Reason != egress.ReasonNameNotAllowed || page.Items[0].Code != audit.EgressDeniedCode || page.Items[0].ExecutionID != exec {
			t.Errorf("got events %+v, want one egress.denied for %s", page.Items, exec)
		}
	})
	t.Run("broker calls are audited", func(t *testing.T) {
		svc := newSvc(t, engine.WithEgress(host))
		const exec = "ex_broker"
		svc.egress.startRun(exec, ws.ID, "")
		labels := map[string]string{engine.LabelExecution: exec}
		svc.egress.brokerCall(engine.BrokerEvent{Event: broker.Event{Sandbox: "sbx-2", Tool: "fetch", Operation: "echo", ParamsSHA256: "abc", Allowed: true, Status: 200}, Labels: labels})
		svc.egress.brokerCall(engine.BrokerEvent{Event: broker.Event{Sandbox: "sbx-2", Tool: "fetch", Operation: "other", Reason: "operation not in the tool's record"}, Labels: labels})
		svc.Close(t.Context())
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
		svc := newSvc(t, engine.WithEgress(host))
		const exec = "ex_flood"
		svc.egress.startRun(exec, ws.ID, "")
		huge := strings.Repeat("a", 60000) + ".test"
		labels := map[string]string{engine.LabelExecution: exec}
		for range maxRefusalEvents - 1 {
			svc.egress.egressDecision(engine.EgressDecision{Decision: egress.Decision{Reason: egress.ReasonNameNotAllowed, Sandbox: "sbx-3", Tool: "fetch", Name: huge, Port: 443, Detail: huge},
				Labels: labels})
		}
		// A refusal quoting what the sandbox sent, past the store's bound on
		// a reason: it is audited, cut.
		svc.egress.brokerCall(engine.BrokerEvent{Event: broker.Event{Sandbox: "sbx-3", Tool: "fetch", Operation: huge,
			Reason: fmt.Sprintf("operation %q is not in tool %q's credentials", huge, "fetch")}, Labels: labels})
		for range 50 {
			svc.egress.egressDecision(engine.EgressDecision{Decision: egress.Decision{Reason: egress.ReasonNameNotAllowed, Sandbox: "sbx-3", Tool: "fetch", Name: huge, Port: 443},
				Labels: labels})
		}
		svc.egress.endRun(exec)
		svc.Close(t.Context())
		events := func(typ string) []model.Event {
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
		o          []engine.Option
		want       string
	}{
		{"default tool denied", "", []engine.Option{engine.WithEgress(host)}, "has none"},
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

// TestRefusalFloodInTheLog has one execution flood the proxy and its DNS
// responder with refusals, some naming a 60,000-byte host, and reads the
// log the daemon would write (the proxy's lines and the service's, at
// Info): at most the refusals audited one by one and one line counting
// the rest, none of them long.
func TestRefusalFloodInTheLog(t *testing.T) {
	eng, logs := newEgressEngine(t, pythonFetch("container", []string{"allowed.test"}, 8080))
	svc := NewService(eng, openSQLite(t), ServiceOptions{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	const exec = "ex_flood"
	svc.egress.startRun(exec, "ws_flood", "")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := eng.Run(ctx, engine.Request{Tool: "fetch", Driver: "runc", Runtime: "python", Network: true,
		Labels: map[string]string{engine.LabelExecution: exec}, Code: []byte(`
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
`)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "flooded\n" {
		t.Fatalf("got stdout %q, stderr %q", res.Stdout, res.Stderr)
	}
	svc.egress.endRun(exec)
	log := logs.String()
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
