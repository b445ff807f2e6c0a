// Package netns prepares the network of a sandbox that is allowed egress
// (docs/design.md §7): a network namespace of its own, a veth pair joining
// it to the host with a /30 from a range the project owns, and host-side
// nftables rules that drop every packet from the sandbox except TCP to the
// egress proxy's ports and DNS (UDP and TCP 53) on the host end of the veth.
// Everything else, other TCP ports, other UDP (QUIC included), ICMP, IPv6,
// anything routed beyond the host, is dropped at the host, whatever the
// sandbox does inside its namespace.
//
// The namespace is bind-mounted at /run/netns/NAME, as `ip netns add` does,
// so that runc and runsc can join it by path (an OCI network namespace
// with a path). For a sandbox with a user namespace of its own (runc's),
// the namespace belongs to a user namespace made with it, bind-mounted at
// /run/stockade/userns/NAME, which the sandbox joins too. Remove deletes
// the rules, the veth and the namespaces; the daemon calls CleanupStale at
// start to remove what a crashed daemon left.
//
//	m, err := netns.NewManager(netns.Config{})
//	removed, err := m.CleanupStale()
//	n, err := m.Create(ctx, netns.Options{ProxyPorts: []uint16{80, 443}})
//	defer n.Remove()
//	// the proxy listens on n.HostAddr; the sandbox joins n.Path.
//
// Everything here needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).
package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/hostids"
)

// RunDir is where named network namespaces are bind-mounted, as iproute2
// does.
const RunDir = "/run/netns"

// UserRunDir is where the user namespaces that own sandbox networks (see
// Options.UserNamespace) are bind-mounted, under the network's name.
const UserRunDir = "/run/stockade/userns"

// pinDirs are where namespaces are bind-mounted, and what CleanupStale and
// Leftovers call what they find there.
var pinDirs = []struct{ dir, what string }{{RunDir, "netns "}, {UserRunDir, "user namespace of "}}

// SandboxIf is the name of the sandbox's end of the veth, inside its
// namespace.
const SandboxIf = "eth0"

// Config configures a Manager. Zero fields take the defaults.
type Config struct {
	// Prefix names everything the manager creates: namespaces
	// "<prefix>-<n>", host interfaces "<prefix>h<n>", nftables tables
	// "<prefix>_<n>". 2-6 lower-case letters; empty means
	// config.DefaultEgressPrefix. Two
	// daemons on one host need different prefixes and ranges.
	Prefix string
	// Range is the IPv4 range the /30 of each sandbox comes from; the zero
	// value means config.DefaultEgressRange (16384 sandboxes). It must be a range no
	// other network of the host uses.
	Range netip.Prefix
	// DNSPort is the port of the DNS responder on the host end; zero
	// means 53.
	DNSPort uint16
	// HostIDs hands out the host ids of the user namespaces that own
	// sandbox networks (Options.UserNamespace); nil means
	// hostids.Default(), which the drivers share.
	HostIDs *hostids.Allocator
}

var prefixPattern = regexp.MustCompile(`^[a-z]{2,6}$`)

// Manager creates and removes sandbox networks. It is safe for concurrent
// use.
type Manager struct {
	cfg   Config
	slots int

	mu   sync.Mutex
	used map[int]bool
	next int
}

// NewManager validates cfg and returns a manager. It touches nothing on the
// host.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = config.DefaultEgressPrefix
	}
	if !cfg.Range.IsValid() {
		cfg.Range = netip.MustParsePrefix(config.DefaultEgressRange)
	}
	if cfg.DNSPort == 0 {
		cfg.DNSPort = 53
	}
	if cfg.HostIDs == nil {
		cfg.HostIDs = hostids.Default()
	}
	switch {
	case !prefixPattern.MatchString(cfg.Prefix):
		return nil, fmt.Errorf("netns: prefix %q must be 2-6 lower-case letters: %w", cfg.Prefix, errdefs.ErrInvalidArgument)
	case !cfg.Range.Addr().Is4() || cfg.Range.Bits() > 29 || cfg.Range.Bits() < 12 || cfg.Range.Masked() != cfg.Range:
		return nil, fmt.Errorf("netns: range %s must be an IPv4 network between /12 and /29: %w", cfg.Range, errdefs.ErrInvalidArgument)
	}
	return &Manager{cfg: cfg, slots: 1 << (30 - cfg.Range.Bits()), used: map[int]bool{}}, nil
}

// Options are the per-sandbox parts of a network.
type Options struct {
	// ProxyPorts are the TCP ports of the host end that the sandbox may
	// reach: the egress proxy's listeners. At least one.
	ProxyPorts []uint16
	// UserNamespace makes the network namespace belong to a new user
	// namespace that maps root to host ids of its own (Net.HostUIDBase,
	// from Config.HostIDs) and the sandbox user (the profile's User) to
	// the next, for a sandbox that runs in that user namespace
	// (Net.UserNSPath): only there can it mount sysfs for the
	// network namespace. Owning the namespace gives that user namespace
	// nothing over the host's rules, which live in the host's network
	// namespace. The ids stay taken until Remove has removed the user
	// namespace's bind mount, which holds them.
	UserNamespace bool
	// Kept makes a network that outlives the daemon, for a sandbox that
	// does (a session's): it has names of its own, which CleanupStale
	// keeps (keep.go).
	Kept bool
}

// Net is one sandbox's network. The caller must call Remove.
type Net struct {
	// Name is the namespace's name; Path its bind mount, which an OCI
	// spec names as the network namespace's path.
	Name string
	Path string
	// HostIf is the host end of the veth; the sandbox's end is SandboxIf.
	HostIf string
	// HostAddr is the host end's address, where the proxy and the DNS
	// responder listen; SandboxAddr the sandbox end's. Both are in Link.
	HostAddr    netip.Addr
	SandboxAddr netip.Addr
	Link        netip.Prefix
	// Table is the nftables table (family inet) holding the rules.
	Table string
	// UserNSPath is the bind mount of the user namespace that owns the
	// network namespace, and HostUIDBase the host id it maps root to
	// (Options.UserNamespace); empty and zero when the host's user
	// namespace owns it.
	UserNSPath  string
	HostUIDBase uint32

	m    *Manager
	ids  *hostids.Lease // HostUIDBase's, held until the user namespace is gone
	slot int
	once sync.Once
	err  error
}

func (m *Manager) names(slot int) (ns, hostIf, table string) {
	n := strconv.Itoa(slot)
	return m.cfg.Prefix + "-" + n, m.cfg.Prefix + "h" + n, m.cfg.Prefix + "_" + n
}

func (m *Manager) alloc() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.slots {
		s := (m.next + i) % m.slots
		if !m.used[s] {
			m.used[s] = true
			m.next = s + 1
			return s, nil
		}
	}
	return 0, fmt.Errorf("netns: all %d sandbox networks of %s are in use: %w", m.slots, m.cfg.Range, errdefs.ErrResourceExhausted)
}

func (m *Manager) free(slot int) {
	m.mu.Lock()
	delete(m.used, slot)
	m.mu.Unlock()
}

// linkOf returns the /30 of slot and its two usable addresses.
func (m *Manager) linkOf(slot int) (netip.Prefix, netip.Addr, netip.Addr) {
	b := m.cfg.Range.Addr().As4()
	base := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	base += uint32(slot) * 4
	at := func(off uint32) netip.Addr {
		v := base + off
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	return netip.PrefixFrom(at(0), 30), at(1), at(2)
}

// Create makes a sandbox network: namespace, veth pair with addresses and
// a default route through the host end, and the host-side rules. On error
// nothing is left behind.
func (m *Manager) Create(ctx context.Context, o Options) (_ *Net, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(o.ProxyPorts) == 0 {
		return nil, fmt.Errorf("netns: at least one proxy port is required: %w", errdefs.ErrInvalidArgument)
	}
	for _, p := range o.ProxyPorts {
		if p == 0 {
			return nil, fmt.Errorf("netns: proxy port 0: %w", errdefs.ErrInvalidArgument)
		}
	}
	slot, err := m.alloc()
	if err != nil {
		return nil, err
	}
	ns, hostIf, table := m.names(slot)
	if o.Kept {
		ns, hostIf, table = m.keptNames(slot)
	}
	link, hostAddr, sbxAddr := m.linkOf(slot)
	n := &Net{Name: ns, Path: filepath.Join(RunDir, ns), HostIf: hostIf, HostAddr: hostAddr, SandboxAddr: sbxAddr, Link: link, Table: table, m: m, slot: slot}
	defer func() {
		if err != nil {
			_ = n.Remove()
		}
	}()
	// A stale leftover of the same name (a crash before CleanupStale ran)
	// would make every step below fail confusingly.
	n.removeParts()

	if err := ensureShared(RunDir); err != nil {
		return nil, err
	}
	if !o.UserNamespace {
		err = newNamed(n.Path)
	} else {
		n.UserNSPath = filepath.Join(UserRunDir, ns)
		if n.ids, err = m.cfg.HostIDs.Allocate(n.UserNSPath); err != nil {
			return nil, fmt.Errorf("creating the user namespace of %s: %w", ns, err)
		}
		n.HostUIDBase = n.ids.Base
		if err = ensureShared(UserRunDir); err == nil {
			err = newNamedInUserNS(n.UserNSPath, n.Path, n.HostUIDBase)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("creating network namespace %s: %w", ns, err)
	}
	nsh, err := vnetns.GetFromPath(n.Path)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", ns, err)
	}
	defer nsh.Close()

	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: SandboxIf, PeerNamespace: netlink.NsFd(int(nsh))}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("creating veth %s: %w", hostIf, err)
	}
	// No IPv6 on the host end: no link-local address for the sandbox to
	// reach, and the rules drop IPv6 anyway.
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+hostIf+"/disable_ipv6", []byte("1"), 0o644)
	hl, err := netlink.LinkByName(hostIf)
	if err != nil {
		return nil, fmt.Errorf("finding veth %s: %w", hostIf, err)
	}
	if err := netlink.AddrAdd(hl, &netlink.Addr{IPNet: ipNet(hostAddr, 30)}); err != nil {
		return nil, fmt.Errorf("addressing %s: %w", hostIf, err)
	}
	// The rules go in before the link is up: no packet ever passes
	// unfiltered.
	if err := addRules(n, o.ProxyPorts, m.cfg.DNSPort); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		return nil, fmt.Errorf("bringing %s up: %w", hostIf, err)
	}

	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return nil, fmt.Errorf("entering network namespace %s: %w", ns, err)
	}
	defer h.Delete()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return nil, fmt.Errorf("bringing lo up in %s: %w", ns, err)
	}
	sl, err := h.LinkByName(SandboxIf)
	if err != nil {
		return nil, fmt.Errorf("finding %s in %s: %w", SandboxIf, ns, err)
	}
	if err := h.AddrAdd(sl, &netlink.Addr{IPNet: ipNet(sbxAddr, 30)}); err != nil {
		return nil, fmt.Errorf("addressing %s in %s: %w", SandboxIf, ns, err)
	}
	if err := h.LinkSetUp(sl); err != nil {
		return nil, fmt.Errorf("bringing %s up in %s: %w", SandboxIf, ns, err)
	}
	// A default route through the host end, so that every packet the
	// sandbox sends meets the host's rules (and is dropped there) instead
	// of failing inside in ways that vary between runc and gVisor.
	if err := h.RouteAdd(&netlink.Route{LinkIndex: sl.Attrs().Index, Gw: hostAddr.AsSlice()}); err != nil {
		return nil, fmt.Errorf("routing in %s: %w", ns, err)
	}
	return n, nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

// Remove deletes the veth, the namespace and the rules. It is idempotent,
// and safe to call while a sandbox still runs in the namespace: the
// sandbox loses its network. It takes about 35 ms, nearly all of it the
// kernel's RCU grace periods (veth about 25 ms, nftables commit about
// 10 ms), so callers should run it off the response path.
func (n *Net) Remove() error {
	n.once.Do(func() {
		n.err = n.removeParts()
		if n.err == nil {
			// A slot whose veth may still exist is not given out again;
			// CleanupStale frees it at the next start. The same for host
			// ids whose user namespace may still be pinned.
			n.m.free(n.slot)
			if n.ids != nil {
				n.err = n.ids.Release()
			}
		}
	})
	return n.err
}

// linkByName looks up a host interface; tests replace it to fail.
var linkByName = netlink.LinkByName

// removeParts removes whatever of n exists; missing parts are success. The
// veth goes first and the rules last, so that no packet of the sandbox can
// ever pass unfiltered, also if a step fails.
func (n *Net) removeParts() error {
	l, err := linkByName(n.HostIf)
	switch {
	case err == nil:
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("deleting veth %s (rules and namespace kept): %w", n.HostIf, err)
		}
	case !errors.As(err, new(netlink.LinkNotFoundError)):
		// The veth may still be there: without its rules the sandbox
		// would reach every port of the host.
		return fmt.Errorf("looking up veth %s (rules and namespace kept): %w", n.HostIf, err)
	}
	var errs []error
	for _, p := range []string{n.Path, filepath.Join(UserRunDir, n.Name)} {
		if err := deleteNamed(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := delTables(func(name string) bool { return name == n.Table }); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CleanupStale removes every host interface, namespace and nftables table
// (in that order) that carries the manager's prefix: what a crashed daemon
// left. Call it at start, before any Create. It returns what it removed.
// It keeps the networks made with Options.Kept, whose sandboxes may be
// re-attached, and holds their slots: Adopt serves them again, RemoveKept
// removes those no sandbox uses any more.
func (m *Manager) CleanupStale() ([]string, error) {
	var removed []string
	var errs []error
	p := m.cfg.Prefix
	nsPat := regexp.MustCompile(`^` + p + `-[0-9]+$`)
	ifPat := regexp.MustCompile(`^` + p + `h[0-9]+$`)
	tPat := regexp.MustCompile(`^` + p + `_[0-9]+$`)

	links, err := netlink.LinkList()
	if err != nil {
		errs = append(errs, fmt.Errorf("listing links: %w", err))
	}
	m.markKept(links)
	for _, l := range links {
		if name := l.Attrs().Name; ifPat.MatchString(name) {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("deleting link %s: %w", name, err))
			} else {
				removed = append(removed, "link "+name)
			}
		}
	}
	for _, d := range pinDirs {
		entries, err := os.ReadDir(d.dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		for _, e := range entries {
			if nsPat.MatchString(e.Name()) {
				if err := deleteNamed(filepath.Join(d.dir, e.Name())); err != nil {
					errs = append(errs, err)
				} else {
					removed = append(removed, d.what+e.Name())
				}
			}
		}
	}
	if len(errs) > 0 {
		// A veth that could not be deleted keeps its rules.
		return removed, errors.Join(errs...)
	}
	tables, err := listTables()
	if err != nil {
		return removed, err
	}
	for _, t := range tables {
		if tPat.MatchString(t) {
			removed = append(removed, "nftables table inet "+t)
		}
	}
	if err := delTables(tPat.MatchString); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// Leftovers lists what of the manager's prefix exists on the host; empty
// means clean. Tests assert it after Remove.
func (m *Manager) Leftovers() []string {
	var out []string
	p := m.cfg.Prefix
	if tables, err := listTables(); err == nil {
		for _, t := range tables {
			if strings.HasPrefix(t, p+"_") {
				out = append(out, "nftables table inet "+t)
			}
		}
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, p+"h") {
				out = append(out, "link "+l.Attrs().Name)
			}
		}
	}
	for _, d := range pinDirs {
		if entries, err := os.ReadDir(d.dir); err == nil {
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), p+"-") {
					out = append(out, d.what+e.Name())
				}
			}
		}
	}
	return out
}

// Do runs f on an OS thread that has joined the namespace, so that the
// sockets f opens belong to it. Tests use it to act as the sandbox.
func (n *Net) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is not unlocked if it cannot go back to the host's
		// namespace: the runtime then ends it with this goroutine.
		orig, err := vnetns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := vnetns.GetFromPath(n.Path)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := vnetns.Set(target); err != nil {
			errc <- err
			return
		}
		ferr := f()
		if err := vnetns.Set(orig); err != nil {
			errc <- errors.Join(ferr, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
