package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/hostids"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// Tests use their own prefix and a corner of the range, so that they never
// touch a running daemon's networks. Every address they send to is in a
// namespace they created, or on the host end of its veth.
const testPrefix = "stkt"

var testRange = netip.MustParsePrefix("10.213.240.0/20")

func newTestManager(t testing.TB) *Manager {
	t.Helper()
	testenv.RequiresRoot(t)
	m, err := NewManager(Config{Prefix: testPrefix, Range: testRange})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.CleanupStale(); err != nil {
		t.Fatalf("CleanupStale: %v", err)
	}
	t.Cleanup(func() {
		if left := m.Leftovers(); len(left) > 0 {
			t.Errorf("left behind: %v", left)
			_, _ = m.CleanupStale()
			_, _ = m.RemoveKept(nil) // a session's network
		}
	})
	return m
}

func create(t testing.TB, m *Manager, ports ...uint16) *Net {
	t.Helper()
	return createWith(t, m, Options{ProxyPorts: ports})
}

func createWith(t testing.TB, m *Manager, o Options) *Net {
	t.Helper()
	n, err := m.Create(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Remove() })
	return n
}

func ipOutput(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func TestCreateRemove(t *testing.T) {
	m := newTestManager(t)
	n := create(t, m, 8080)
	if n.Link.Bits() != 30 || !testRange.Contains(n.HostAddr) || !n.Link.Contains(n.SandboxAddr) || n.HostAddr == n.SandboxAddr {
		t.Fatalf("addresses %s %s in %s, want a /30 of %s", n.HostAddr, n.SandboxAddr, n.Link, testRange)
	}
	if out := ipOutput(t, "netns", "list"); !strings.Contains(out, n.Name) {
		t.Fatalf("ip netns list = %q, want %s", out, n.Name)
	}
	if out := ipOutput(t, "-n", n.Name, "-4", "addr", "show", "dev", SandboxIf); !strings.Contains(out, n.SandboxAddr.String()+"/30") {
		t.Fatalf("sandbox end: %q, want %s/30", out, n.SandboxAddr)
	}
	if out := ipOutput(t, "-n", n.Name, "route"); !strings.Contains(out, "default via "+n.HostAddr.String()) {
		t.Fatalf("sandbox routes: %q, want a default route via %s", out, n.HostAddr)
	}
	if out := ipOutput(t, "-4", "addr", "show", "dev", n.HostIf); !strings.Contains(out, n.HostAddr.String()+"/30") {
		t.Fatalf("host end: %q, want %s/30", out, n.HostAddr)
	}
	if tables, _ := listTables(); !slices.Contains(tables, n.Table) {
		t.Fatalf("nftables tables %v, want %s", tables, n.Table)
	}
	if err := n.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := n.Remove(); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	assertGone(t, m, n)
}

// TestUserNamespace checks a network made for a sandbox with a user
// namespace of its own: the network namespace belongs to the user
// namespace bind-mounted at UserNSPath (which runc proves it can join and
// mount sysfs in: TestRuntimesJoinNamespace), and Remove leaves neither.
func TestUserNamespace(t *testing.T) {
	m := newTestManager(t)
	// One slot of ids, outside the range of real sandboxes: a second
	// network waits for the first one's Remove.
	base := uint32(sandbox.FirstHostID + 2*sandbox.HostIDSlots)
	m.cfg.HostIDs = &hostids.Allocator{Dir: t.TempDir(), First: base, Slots: 1}
	n := createWith(t, m, Options{ProxyPorts: []uint16{8080}, UserNamespace: true})
	if n.HostUIDBase != base || n.UserNSPath != filepath.Join(UserRunDir, n.Name) {
		t.Fatalf("user namespace %q with base %d, want %s with %d", n.UserNSPath, n.HostUIDBase, filepath.Join(UserRunDir, n.Name), base)
	}
	if _, err := m.Create(t.Context(), Options{ProxyPorts: []uint16{8080}, UserNamespace: true}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a second network while the first holds the only ids: got %v, want ErrResourceExhausted", err)
	}
	nsf, err := os.Open(n.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer nsf.Close()
	owner, err := unix.IoctlRetInt(int(nsf.Fd()), unix.NS_GET_USERNS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(owner)
	var got, want unix.Stat_t
	if err := unix.Fstat(owner, &got); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(n.UserNSPath, &want); err != nil {
		t.Fatal(err)
	}
	var host unix.Stat_t
	if err := unix.Stat("/proc/self/ns/user", &host); err != nil {
		t.Fatal(err)
	}
	if got.Ino != want.Ino || got.Ino == host.Ino {
		t.Fatalf("the network namespace belongs to user namespace %d; want %d (%s), not the host's %d", got.Ino, want.Ino, n.UserNSPath, host.Ino)
	}
	if err := n.Remove(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, m, n)
	if _, err := os.Stat(n.UserNSPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after Remove: %v", n.UserNSPath, err)
	}
	again := createWith(t, m, Options{ProxyPorts: []uint16{8080}, UserNamespace: true})
	if again.HostUIDBase != base {
		t.Errorf("after Remove: got base %d, want the freed %d", again.HostUIDBase, base)
	}
	if err := again.Remove(); err != nil {
		t.Fatal(err)
	}
}

// assertGone checks with ip(8) and nftables that nothing of n is left.
func assertGone(t *testing.T, m *Manager, n *Net) {
	t.Helper()
	if left := m.Leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	if out := ipOutput(t, "netns", "list"); strings.Contains(out, n.Name) {
		t.Fatalf("ip netns list still shows %s: %q", n.Name, out)
	}
	if out := ipOutput(t, "link"); strings.Contains(out, n.HostIf+"@") || strings.Contains(out, n.HostIf+":") {
		t.Fatalf("ip link still shows %s: %q", n.HostIf, out)
	}
	if tables, _ := listTables(); slices.Contains(tables, n.Table) {
		t.Fatalf("nftables table %s still there", n.Table)
	}
}

func TestCleanupStale(t *testing.T) {
	m := newTestManager(t)
	n1 := create(t, m, 80)
	n2 := createWith(t, m, Options{ProxyPorts: []uint16{443}, UserNamespace: true})
	// A crashed daemon: a new manager knows nothing of n1 and n2.
	m2, err := NewManager(Config{Prefix: testPrefix, Range: testRange})
	if err != nil {
		t.Fatal(err)
	}
	removed, err := m2.CleanupStale()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"netns " + n1.Name, "netns " + n2.Name, "user namespace of " + n2.Name, "nftables table inet " + n1.Table} {
		if !slices.Contains(removed, want) {
			t.Errorf("CleanupStale removed %v, want %q among them", removed, want)
		}
	}
	assertGone(t, m, n1)
	assertGone(t, m, n2)
	// Remove of what CleanupStale took is still success.
	if err := n1.Remove(); err != nil {
		t.Fatal(err)
	}
}

// listen opens a TCP listener on the host that answers "ok <port>" to each
// connection.
func listen(t *testing.T, addr netip.Addr, port uint16) {
	t.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(addr, port).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "ok %d\n", port)
			c.Close()
		}
	}()
}

// dialFrom connects from inside n and reads the greeting.
func dialFrom(n *Net, network string, to netip.AddrPort) (string, error) {
	var got string
	err := n.Do(func() error {
		c, err := net.DialTimeout(network, to.String(), 400*time.Millisecond)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(400 * time.Millisecond))
		if network == "udp" {
			if _, err := c.Write([]byte("ping")); err != nil {
				return err
			}
		}
		b, err := io.ReadAll(io.LimitReader(c, 64))
		got = string(b)
		if network == "udp" && len(b) > 0 {
			err = nil
		}
		return err
	})
	return got, err
}

// waitForPath waits, at most 10 s, until a TCP connection from n to the
// address gets an answer.
func waitForPath(t *testing.T, n *Net, to netip.AddrPort) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := dialFrom(n, "tcp", to)
		if err == nil && got != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer from %s within 10 s: %v", to, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// udpEcho answers each datagram on the host with "pong".
func udpEcho(t *testing.T, addr netip.Addr, port uint16) {
	t.Helper()
	pc, err := net.ListenPacket("udp", netip.AddrPortFrom(addr, port).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(append([]byte("pong "), buf[:n]...), from)
		}
	}()
}

func TestRulesDropAllButProxyAndDNS(t *testing.T) {
	m := newTestManager(t)
	n1 := create(t, m, 8080)
	n2 := create(t, m, 8080)
	for _, n := range []*Net{n1, n2} {
		listen(t, n.HostAddr, 8080) // the proxy
		listen(t, n.HostAddr, 9999) // anything else on the host
		listen(t, n.HostAddr, 53)   // DNS over TCP
		udpEcho(t, n.HostAddr, 53)
		udpEcho(t, n.HostAddr, 5353)
	}
	ap := netip.AddrPortFrom
	// A new veth can take a moment to pass traffic on a loaded machine.
	// Wait until the allowed path answers, so that the refusals below are
	// the rules' and not a link still coming up.
	waitForPath(t, n1, ap(n1.HostAddr, 8080))
	for _, tc := range []struct {
		name    string
		network string
		to      netip.AddrPort
		ok      bool
	}{
		{"proxy port", "tcp", ap(n1.HostAddr, 8080), true},
		{"dns over tcp", "tcp", ap(n1.HostAddr, 53), true},
		{"dns over udp", "udp", ap(n1.HostAddr, 53), true},
		{"other tcp port on the host end", "tcp", ap(n1.HostAddr, 9999), false},
		{"other udp port on the host end", "udp", ap(n1.HostAddr, 5353), false},
		{"another sandbox's proxy", "tcp", ap(n2.HostAddr, 8080), false},
		{"another sandbox's dns", "udp", ap(n2.HostAddr, 53), false},
		{"another sandbox itself", "tcp", ap(n2.SandboxAddr, 8080), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := dialFrom(n1, tc.network, tc.to)
			if tc.ok && (err != nil || got == "") {
				t.Fatalf("got %q, %v; want an answer", got, err)
			}
			if !tc.ok && err == nil && got != "" {
				t.Fatalf("got %q through the rules, want nothing", got)
			}
		})
	}
}

// TestEgressEndToEnd is the whole path as a sandbox sees it, from a
// goroutine in the namespace: DNS on the host end answers an allowed name
// with the proxy's address, the proxy there forwards to a loopback
// upstream, and everything else fails.
func TestEgressEndToEnd(t *testing.T) {
	m := newTestManager(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "upstream saw %s", r.Host)
	}))
	defer up.Close()
	upPort := up.Listener.Addr().(*net.TCPAddr).Port

	var mu sync.Mutex
	var refusals []egress.Decision
	rec := func(d egress.Decision) {
		if !d.Allowed {
			mu.Lock()
			refusals = append(refusals, d)
			mu.Unlock()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := openEgress(t, ctx, m, rec, upPort, nil, false)
	if !slices.Equal(n.Ports, []uint16{uint16(upPort)}) || !strings.Contains(string(n.ResolvConf), "nameserver "+n.HostAddr.String()+"\n") {
		t.Fatalf("ports %v resolv.conf %q", n.Ports, n.ResolvConf)
	}

	// The sandbox's resolver: its resolv.conf names the host end.
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, netip.AddrPortFrom(n.HostAddr, 53).String())
	}}
	err := n.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		addrs, err := res.LookupHost(ctx, "api.allowed.test")
		if err != nil || len(addrs) != 1 || addrs[0] != n.HostAddr.String() {
			return fmt.Errorf("lookup api.allowed.test = %v, %v; want %s", addrs, err, n.HostAddr)
		}
		if _, err := res.LookupHost(ctx, "evil.test"); err == nil {
			return errors.New("lookup evil.test succeeded")
		}
		c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				host, port, _ := net.SplitHostPort(addr)
				ips, err := res.LookupHost(ctx, host)
				if err != nil {
					return nil, err
				}
				return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(ips[0], port))
			},
		}}
		resp, err := c.Get(fmt.Sprintf("http://api.allowed.test:%d/", upPort))
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "upstream saw api.allowed.test") {
			return fmt.Errorf("got %d %q, want the upstream's answer", resp.StatusCode, body)
		}
		// The upstream itself is on the host's loopback, which the
		// sandbox's own loopback hides; the broker port is closed when the
		// tool has no broker.
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", upPort), 300*time.Millisecond); err == nil {
			c.Close()
			return errors.New("the host's loopback upstream is reachable directly")
		}
		if c, err := net.DialTimeout("tcp", netip.AddrPortFrom(n.HostAddr, BrokerPort).String(), 300*time.Millisecond); err == nil {
			c.Close()
			return errors.New("port 80 on the host end is reachable without a broker")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refusals) == 0 || refusals[0].Protocol != egress.ProtoDNS || refusals[0].Name != "evil.test" || refusals[0].Sandbox != "sbx-netns-test" {
		t.Errorf("refusals %+v, want the DNS refusal of evil.test", refusals)
	}
}

type failResolver struct{}

func (failResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, errors.New("no resolver in tests")
}

// BenchmarkCreateRemove measures the network setup a sandbox with egress
// adds: Create then Remove. Run with -benchtime=20x for the median of 20.
func BenchmarkCreateRemove(b *testing.B) {
	m := newTestManager(b)
	var ds []time.Duration
	for b.Loop() {
		t0 := time.Now()
		n, err := m.Create(context.Background(), Options{ProxyPorts: []uint16{80, 443}})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := n.Remove(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, t1.Sub(t0), time.Since(t1))
	}
	var create, remove, total []time.Duration
	for i := 0; i < len(ds); i += 2 {
		create, remove, total = append(create, ds[i]), append(remove, ds[i+1]), append(total, ds[i]+ds[i+1])
	}
	median := func(s []time.Duration) float64 {
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	b.ReportMetric(median(create), "create-median-ms")
	b.ReportMetric(median(remove), "remove-median-ms")
	b.ReportMetric(median(total), "total-median-ms")
}

// BenchmarkOpenEgress measures everything a one-shot run with egress adds
// on the host: namespace, veth, rules, proxy and DNS listeners, then their
// removal. Run with -benchtime=20x for the median of 20.
func BenchmarkOpenEgress(b *testing.B) {
	m := newTestManager(b)
	p, err := egress.New(egress.Config{})
	if err != nil {
		b.Fatal(err)
	}
	pol := egress.Policy{Sandbox: "bench", Allow: []string{"api.example.com"}, Ports: []int{443}, Broker: http.NotFoundHandler()}
	// The namespace in the host's user namespace (gVisor's sandboxes), and
	// in one of its own (runc's).
	for _, userNS := range []bool{false, true} {
		b.Run(fmt.Sprintf("userns=%v", userNS), func(b *testing.B) {
			var open, closing []time.Duration
			for b.Loop() {
				t0 := time.Now()
				e, err := m.OpenEgress(context.Background(), p, pol, userNS)
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := e.Close(); err != nil {
					b.Fatal(err)
				}
				open, closing = append(open, t1.Sub(t0)), append(closing, time.Since(t1))
			}
			median := func(s []time.Duration) float64 {
				slices.Sort(s)
				return float64(s[len(s)/2].Microseconds()) / 1000
			}
			b.ReportMetric(median(open), "open-median-ms")
			b.ReportMetric(median(closing), "close-median-ms")
		})
	}
}

func TestConcurrentCreate(t *testing.T) {
	m := newTestManager(t)
	const k = 8
	nets := make([]*Net, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() { nets[i], errs[i] = m.Create(context.Background(), Options{ProxyPorts: []uint16{443}}) })
	}
	wg.Wait()
	seen := map[netip.Addr]bool{}
	for i, n := range nets {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if seen[n.HostAddr] {
			t.Fatalf("address %s given twice", n.HostAddr)
		}
		seen[n.HostAddr] = true
	}
	for i, n := range nets {
		wg.Go(func() { errs[i] = n.Remove() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if left := m.Leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestRemoveKeepsRulesWhenTheVethIsUnknown makes the veth's lookup fail
// with another error than "not found": Remove must keep the rules and the
// namespace (the veth may still be up) and fail, and keep the slot.
func TestRemoveKeepsRulesWhenTheVethIsUnknown(t *testing.T) {
	m := newTestManager(t)
	n := create(t, m, 8080)
	linkByName = func(string) (netlink.Link, error) { return nil, unix.ENOBUFS }
	err := n.Remove()
	linkByName = netlink.LinkByName
	if err == nil || !strings.Contains(err.Error(), "rules and namespace kept") {
		t.Fatalf("Remove with the lookup failing: got %v, want an error keeping the rules", err)
	}
	if tables, _ := listTables(); !slices.Contains(tables, n.Table) {
		t.Errorf("nftables tables %v after the failed Remove, want %s kept", tables, n.Table)
	}
	m.mu.Lock()
	_, used := m.used[n.slot]
	m.mu.Unlock()
	if !used {
		t.Errorf("slot %d was given back although its veth may still exist", n.slot)
	}
	if _, err := m.CleanupStale(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, m, n)
}

// TestOpenEgressRefusesTheDNSPort checks that a policy naming the DNS port
// is refused up front: the proxy would take the port from the responder.
func TestOpenEgressRefusesTheDNSPort(t *testing.T) {
	m := newTestManager(t)
	p, err := egress.New(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.OpenEgress(t.Context(), p, egress.Policy{Sandbox: "sbx-dns", Tool: "t", Allow: []string{"api.example.com"}, Ports: []int{443, 53}}, false)
	if err == nil || !strings.Contains(err.Error(), "DNS responder") {
		t.Fatalf("OpenEgress with port 53: got %v, want a refusal naming the DNS responder", err)
	}
	if left := m.Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
