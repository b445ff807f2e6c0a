package conformance

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/sandbox"
)

// The checks of the sandbox's network: nothing but lo.

func (s *suite) network(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()

	b := s.start(t, sandbox.Limits{})
	var r struct {
		Netlink struct {
			errno
			Names []string `json:"names"`
		} `json:"netlink"`
		ProcNetDev  []string `json:"proc_net_dev"`
		SysClassNet []string `json:"sys_class_net"`
		Addresses   struct {
			errno
			Addrs []string `json:"addrs"`
		} `json:"addresses"`
		Connect         []connectResult `json:"connect"`
		LoopbackConnect connectResult   `json:"loopback_connect"`
		UDPSocket       errno           `json:"udp_socket"`
		PingSocket      errno           `json:"ping_socket"`
		Ping6Socket     errno           `json:"ping6_socket"`
		PingHighBits    errno           `json:"ping_socket_high_bits"`
		HighPort        errno           `json:"high_port"`
		LowPort         errno           `json:"low_port"`
	}
	addr := ln.Addr().String()
	b.report(t, &r, "net", addr)
	// Give a connection that did get through time to be accepted.
	time.Sleep(100 * time.Millisecond)

	seen := map[string]bool{}
	for _, n := range slices.Concat(r.Netlink.Names, r.ProcNetDev, r.SysClassNet) {
		seen[n] = true
	}
	if !slices.Contains(r.Netlink.Names, "lo") || !slices.Contains(r.ProcNetDev, "lo") {
		t.Errorf("the probe did not find lo (netlink %v: %s, /proc/net/dev %v); want it found both ways", r.Netlink.Names, r.Netlink.errno, r.ProcNetDev)
	}
	for n := range seen {
		if !slices.Contains(s.p.Network.Interfaces, n) {
			t.Errorf("interface %s is visible (netlink %v, /proc/net/dev %v, /sys/class/net %v), want only %s", n, r.Netlink.Names, r.ProcNetDev, r.SysClassNet, strings.Join(s.p.Network.Interfaces, ", "))
		}
	}
	if !slices.ContainsFunc(r.Addresses.Addrs, func(a string) bool { return strings.HasPrefix(a, "127.0.0.1/") }) {
		t.Errorf("the probe found addresses %v (%s), want 127.0.0.1 among them", r.Addresses.Addrs, r.Addresses.errno)
	}
	for _, a := range r.Addresses.Addrs {
		if !strings.HasPrefix(a, "127.") && !strings.HasPrefix(a, "::1/") {
			t.Errorf("address %s is configured, want loopback addresses only", a)
		}
	}
	if len(r.Connect) != 1 {
		t.Fatalf("got %d connect results, want 1", len(r.Connect))
	}
	t.Logf("connect to the host's %s from the sandbox: %s", addr, r.Connect[0].Result)
	// The control: the same connect to a listener of the sandbox's own.
	if r.LoopbackConnect.Result != "connected" {
		t.Errorf("connect to a listener on the sandbox's own loopback (%s): got %s, want connected", r.LoopbackConnect.Addr, r.LoopbackConnect.Result)
	}
	if r.Connect[0].Result == "connected" {
		t.Errorf("connect to the host's %s: got connected, want it to fail", addr)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host listener on %s accepted %d connections during the run, want 0", addr, n)
	}
	// The controls: a datagram socket and a bind to a free port work.
	if r.UDPSocket.Errno != 0 || r.HighPort.Errno != 0 {
		t.Errorf("socket(AF_INET, SOCK_DGRAM, 0): got %s; bind to 127.0.0.1:0: got %s; want success for both", r.UDPSocket, r.HighPort)
	}
	// ICMP sockets stay out of reach: on the host kernel the profile's
	// net.ipv4.ping_group_range, a range without the sandbox's group
	// (which Docker changes for its containers, and the docker driver
	// sets back), refuses them with EACCES; gVisor's netstack implements
	// no such setting, and the profile's filter refuses them there
	// (oci.UserSpaceKernel).
	pingRange, _ := s.p.Network.Sysctl("net.ipv4.ping_group_range")
	if !groupOutside(pingRange, s.p.User.GID) {
		t.Fatalf("the profile's net.ipv4.ping_group_range %q admits the sandbox's group %d; the suite asserts refused ICMP sockets only", pingRange, s.p.User.GID)
	}
	wantPing, why := syscall.EACCES, "net.ipv4.ping_group_range "+strconv.Quote(pingRange)
	if !s.sharedKernel() {
		wantPing, why = syscall.EPERM, "the profile's filter"
	}
	for name, e := range map[string]errno{
		"socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)":                r.PingSocket,
		"socket(AF_INET6, SOCK_DGRAM, IPPROTO_ICMPV6)":             r.Ping6Socket,
		"socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP with high bits)": r.PingHighBits,
	} {
		if !e.is(wantPing) {
			t.Errorf("%s: got %s, want %s (%s)", name, e, unix.ErrnoName(wantPing), why)
		}
	}
	// Ports below the profile's net.ipv4.ip_unprivileged_port_start for
	// privileged processes only; the probe binds port 80.
	start, _ := s.p.Network.Sysctl("net.ipv4.ip_unprivileged_port_start")
	if n, err := strconv.Atoi(start); err != nil || n <= 80 {
		t.Fatalf("the profile's net.ipv4.ip_unprivileged_port_start %q does not keep port 80 privileged; the suite asserts a refused bind only", start)
	}
	why = "net.ipv4.ip_unprivileged_port_start " + start
	s.expect(t, "low-ports", r.LowPort.Errno != 0, "bind to 127.0.0.1:80: got success, want EACCES (%s)", why)
	if r.LowPort.Errno != 0 && !r.LowPort.is(syscall.EACCES) {
		t.Errorf("bind to 127.0.0.1:80: got %s, want EACCES (%s)", r.LowPort, why)
	}
}

// groupOutside reports whether gid lies outside a net.ipv4.ping_group_range
// value ("low high"; low above high is the empty range).
func groupOutside(rng string, gid uint32) bool {
	var lo, hi int64
	if _, err := fmt.Sscanf(rng, "%d %d", &lo, &hi); err != nil {
		return false
	}
	return int64(gid) < lo || int64(gid) > hi
}

// connectResult is the probe's report of one TCP connect.
type connectResult struct {
	Addr   string `json:"addr"`
	Result string `json:"result"`
	Errno  int    `json:"errno"`
}
