package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
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

// egressEnv is an engine with runc and gvisor and real sandbox networks,
// whose proxy reaches loopback upstreams through a test override.
type egressEnv struct {
	eng      *Engine
	nets     *netns.Manager
	resolver *mapResolver
	// logs holds what the proxy logs, as the daemon's log would (Info).
	logs *testenv.Buffer

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
	env := &egressEnv{resolver: &mapResolver{names: resolve}, logs: &testenv.Buffer{}}
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
			if err := env.eng.Wait(context.Background()); err != nil {
				tb.Error(err)
			}
		}
		if left := nets.Leftovers(); len(left) > 0 {
			tb.Errorf("left behind: %v", left)
			_, _ = nets.CleanupStale()
			_, _ = nets.RemoveKept(nil) // a session's network
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
	// The shim, for a session's detached sandbox.
	gv, err := gvisor.New(gvisor.Config{StateDir: tb.TempDir(), GuestPath: guest, Shim: testenv.Shim(tb)})
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
			if err := env.eng.Wait(t.Context()); err != nil {
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
