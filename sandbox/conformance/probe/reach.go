package main

import (
	"net/netip"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds the subcommands of the blast-radius audit (package
// blastradius): `reach` surveys in one run everything a payload in the
// sandbox can see and try, `pidlimit` measures how many processes it can
// start. Like every subcommand they report and never judge; the host
// compares the report with the tool's isolation record.

// Bounds of the filesystem walk, so that a tool with a large data mount
// cannot make the survey run away.
const (
	walkMaxEntries = 300000
	walkMaxDepth   = 48
	walkMaxListed  = 200 // paths listed per category; the counts go on
)

// reach reports the environment's names (and PATH's value alone: other
// values may be secrets), the identity and privileges (caps), namespaces,
// mounts, a walk of the filesystem, /dev, unix sockets, interfaces, three
// outbound attempts (TCP to hostAddr, TCP to the link-local metadata
// address, a DNS lookup of a public name) and the resource limits visible
// from inside.
func reach(hostAddr string) obj {
	mounts := mountinfo()
	var points []string
	for _, m := range mounts {
		for _, f := range m {
			if p, ok := f.v.(string); ok && f.k == "mount_point" {
				points = append(points, p)
			}
		}
	}
	outbound := []obj{
		append(obj{{"kind", "tcp_host_loopback"}}, tcpConnect(hostAddr)...),
		append(obj{{"kind", "tcp_metadata"}}, tcpConnect("169.254.169.254:80")...),
	}
	outbound = append(outbound, dnsLookup("example.com")...)
	return obj{
		{"env", envNames()},
		{"path", os.Getenv("PATH")},
		{"caps", caps()},
		{"namespaces", namespaces()},
		{"mounts", mounts},
		{"walk", walk(points)},
		{"dev", devEntries()},
		{"unix_sockets", procNetUnix()},
		{"net", netProbe(nil)},
		{"outbound", outbound},
		{"limits", limits()},
	}
}

// envNames lists the names of the environment's variables.
func envNames() []string {
	names := []string{}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// namespaces reads the /proc/self/ns links ("net:[4026531993]").
func namespaces() []obj {
	out := []obj{}
	for _, n := range []string{"cgroup", "ipc", "mnt", "net", "pid", "pid_for_children", "time", "time_for_children", "user", "uts"} {
		link, err := os.Readlink("/proc/self/ns/" + n)
		out = append(out, append(obj{{"name", n}, {"link", link}}, attempt(err)...))
	}
	return out
}

// walker is the state of one filesystem walk.
type walker struct {
	points        []string // mount points, longest first
	entries       int
	truncated     bool
	readable      map[string]int // readable regular files by mount point
	unreadable    int
	unreadableDir int
	writableDirs  []string
	writableFiles []string
	writableCount int
	sockets       []string
}

// walk visits the filesystem from / (without following symlinks, skipping
// /proc and /sys) and reports what the process may read and write there,
// as access(2) answers for it: the kernel's own permission and read-only
// mount checks.
func walk(points []string) obj {
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	w := &walker{points: points, readable: map[string]int{}}
	start := time.Now()
	w.dir("/", 0)
	byMount := []obj{}
	keys := make([]string, 0, len(w.readable))
	for k := range w.readable {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		byMount = append(byMount, obj{{"mount_point", k}, {"files", w.readable[k]}})
	}
	total := 0
	for _, n := range w.readable {
		total += n
	}
	return obj{
		{"entries", w.entries}, {"truncated", w.truncated}, {"elapsed_ms", time.Since(start).Milliseconds()},
		{"readable_files", total}, {"readable_by_mount", byMount},
		{"unreadable_files", w.unreadable}, {"unreadable_dirs", w.unreadableDir},
		{"writable_dirs", nonNil(w.writableDirs)}, {"writable_files", nonNil(w.writableFiles)},
		{"writable_count", w.writableCount}, {"sockets", nonNil(w.sockets)},
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (w *walker) mountOf(p string) string {
	for _, m := range w.points {
		if m == "/" || p == m || strings.HasPrefix(p, m+"/") {
			return m
		}
	}
	return "/"
}

func (w *walker) dir(dir string, depth int) {
	if unix.Access(dir, unix.W_OK) == nil {
		w.writableCount++
		if len(w.writableDirs) < walkMaxListed {
			w.writableDirs = append(w.writableDirs, dir)
		}
	}
	if depth > walkMaxDepth {
		w.truncated = true
		return
	}
	f, err := os.Open(dir)
	if err != nil {
		w.unreadableDir++
		return
	}
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil && len(ents) == 0 {
		w.unreadableDir++
		return
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	for _, e := range ents {
		if w.entries >= walkMaxEntries {
			w.truncated = true
			return
		}
		w.entries++
		p := dir + "/" + e.Name()
		if dir == "/" {
			p = "/" + e.Name()
		}
		t := e.Type()
		if t.IsRegular() && strings.HasPrefix(p, "/dev/") {
			// In a user namespace runc bind-mounts the host's device
			// nodes over empty files: the entry says regular file, the
			// mounted node is a device.
			if fi, err := os.Lstat(p); err == nil {
				t = fi.Mode().Type()
			}
		}
		switch {
		case p == "/proc" || p == "/sys":
			// Kernel interfaces, not files: reported by the other
			// findings (mounts, namespaces, limits).
		case t.IsDir():
			w.dir(p, depth+1)
		case t&os.ModeSymlink != 0:
			// Not followed: its target is visited where it lies.
		case t&os.ModeSocket != 0:
			if len(w.sockets) < walkMaxListed {
				w.sockets = append(w.sockets, p)
			}
			w.writable(p)
		case t&os.ModeDevice != 0 || t&os.ModeCharDevice != 0:
			// Devices are reported by devEntries.
		case t.IsRegular():
			if unix.Access(p, unix.R_OK) == nil {
				w.readable[w.mountOf(p)]++
			} else {
				w.unreadable++
			}
			w.writable(p)
		default: // fifos and anything else
			w.writable(p)
		}
	}
}

func (w *walker) writable(p string) {
	if unix.Access(p, unix.W_OK) == nil {
		w.writableCount++
		if len(w.writableFiles) < walkMaxListed {
			w.writableFiles = append(w.writableFiles, p)
		}
	}
}

// procNetUnix lists the unix sockets of the network namespace from
// /proc/net/unix: their paths ("@name" for abstract ones) and how many have
// no name.
func procNetUnix() obj {
	b, err := readLimited("/proc/net/unix", 1<<20)
	paths := []string{}
	unnamed := 0
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 7 {
			continue
		}
		if len(f) >= 8 {
			paths = append(paths, f[7])
		} else {
			unnamed++
		}
	}
	return append(obj{{"paths", paths}, {"unnamed", unnamed}}, attempt(err)...)
}

// limits reports the limits visible from inside: the cgroup files where a
// cgroup filesystem is mounted (v2, then v1), the rlimits, and MemTotal.
func limits() obj {
	file := func(paths ...string) obj {
		for _, p := range paths {
			if b, err := readLimited(p, 256); err == nil {
				return obj{{"path", p}, {"value", strings.TrimSpace(string(b))}}
			}
		}
		return obj{{"path", ""}, {"value", ""}}
	}
	rlimit := func(res int) obj {
		var r unix.Rlimit
		err := unix.Getrlimit(res, &r)
		return append(obj{{"cur", limitString(r.Cur)}, {"max", limitString(r.Max)}}, attempt(err)...)
	}
	memTotal := int64(-1)
	for _, line := range strings.Split(readTrim("/proc/meminfo"), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			if kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64); err == nil {
				memTotal = kb << 10
			}
		}
	}
	return obj{
		{"cgroup_pids_max", file("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max")},
		{"cgroup_memory_max", file("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")},
		{"rlimit_nproc", rlimit(unix.RLIMIT_NPROC)},
		{"rlimit_as", rlimit(unix.RLIMIT_AS)},
		{"rlimit_nofile", rlimit(unix.RLIMIT_NOFILE)},
		{"meminfo_total_bytes", memTotal},
		{"tasks", countTasks()},
	}
}

func limitString(v uint64) string {
	if v == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return strconv.FormatUint(v, 10)
}

// countTasks counts the threads of every process visible in /proc: in a
// new pid namespace, every task of the sandbox.
func countTasks() int {
	n := 0
	for _, name := range listDir("/proc") {
		if _, err := strconv.Atoi(name); err == nil {
			n += len(listDir("/proc/" + name + "/task"))
		}
	}
	return n
}

// pidlimit counts the sandbox's tasks, then forks children that sleep
// until fork is refused (at most max of them), kills them and reports: the
// tasks and the children together are the number of processes and threads
// the sandbox can hold. It waits paceUs microseconds after each fork.
//
// After each fork it writes "forked N" on stderr, so that the count
// survives the sandbox: on gVisor every process also costs host memory
// charged to the sandbox's memory limit, which may end the sandbox first.
// While the children live it takes forkbomb's care: one locked thread,
// signals blocked, raw system calls only, no allocation.
func pidlimit(max int, paceUs int64) obj {
	tasks := countTasks()
	writeAll(2, []byte("tasks "+strconv.Itoa(tasks)+"\n"))
	runtime.GC()
	runtime.GOMAXPROCS(1)
	runtime.LockOSThread()
	pids := make([]int, 0, max)
	var line [32]byte
	copy(line[:], "forked ")
	var firstErr syscall.Errno
	ts := unix.Timespec{Nsec: paceUs * 1000}
	old := blockSignals()
	for len(pids) < max {
		pid, e := forkPauser()
		if e != 0 {
			firstErr = e
			break
		}
		pids = append(pids, pid)
		n := 7 + putDecimal(line[7:], len(pids))
		line[n] = '\n'
		syscall.RawSyscall(syscall.SYS_WRITE, 2, uintptr(unsafe.Pointer(&line[0])), uintptr(n+1))
		if paceUs > 0 {
			syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
		}
	}
	killAndReap(pids)
	restoreSignals(old)
	runtime.UnlockOSThread()
	o := obj{{"tasks_before", tasks}, {"forked", len(pids)}, {"max", max}}
	return append(o, errf(firstErr)...)
}

// putDecimal writes n (>= 0) in decimal at the start of b, without
// allocating, and returns the number of digits.
//
//go:nosplit
func putDecimal(b []byte, n int) int {
	var tmp [20]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return copy(b, tmp[i:])
}

// dnsLookup asks each nameserver of /etc/resolv.conf (the resolver's
// default, 127.0.0.1, when there is none) for name's A record, as a libc
// resolver would, over UDP with a 2 s timeout, and reports each attempt.
func dnsLookup(name string) []obj {
	var servers []string
	for _, line := range strings.Split(readTrim("/etc/resolv.conf"), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "nameserver" && len(servers) < 3 {
			servers = append(servers, f[1])
		}
	}
	note := "nameservers from /etc/resolv.conf"
	if len(servers) == 0 {
		servers, note = []string{"127.0.0.1"}, "no nameserver in /etc/resolv.conf: the resolver's default"
	}
	var out []obj
	for _, s := range servers {
		o := obj{{"kind", "dns"}, {"name", name}, {"addr", s + ":53"}, {"note", note}}
		result, e := dnsQuery(s, name)
		out = append(out, append(o, field{"result", result}, field{"errno", e}))
	}
	return out
}

// dnsQuery sends one A query for name to server:53 and returns the answer
// ("resolved 192.0.2.1 ...", "no answer (rcode N)"), "timeout", or the
// errno's name, with the errno (0 when a reply came, -1 for a timeout).
func dnsQuery(server, name string) (string, int) {
	ip := parseIP(server)
	if ip == nil {
		return "bad nameserver address", -1
	}
	family := unix.AF_INET
	var sa unix.Sockaddr
	if len(ip) == 4 {
		sa = &unix.SockaddrInet4{Port: 53, Addr: [4]byte(ip)}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: 53, Addr: [16]byte(ip)}
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "socket: " + unix.ErrnoName(errnoOf(err)), int(errnoOf(err))
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, sa); err != nil {
		return unix.ErrnoName(errnoOf(err)), int(errnoOf(err))
	}
	id := uint16(os.Getpid())
	q := []byte{byte(id >> 8), byte(id), 1, 0, 0, 1, 0, 0, 0, 0, 0, 0} // RD, one question
	for _, label := range strings.Split(name, ".") {
		q = append(q, byte(len(label)))
		q = append(q, label...)
	}
	q = append(q, 0, 0, 1, 0, 1) // root, type A, class IN
	if _, err := unix.Write(fd, q); err != nil {
		return unix.ErrnoName(errnoOf(err)), int(errnoOf(err))
	}
	deadline := time.Now().Add(2 * time.Second)
	buf := make([]byte, 1500)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return "timeout", -1
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return unix.ErrnoName(errnoOf(err)), int(errnoOf(err))
		}
		if n == 0 {
			return "timeout", -1
		}
		m, err := unix.Read(fd, buf)
		if err != nil {
			// An ICMP port unreachable arrives as ECONNREFUSED here.
			return unix.ErrnoName(errnoOf(err)), int(errnoOf(err))
		}
		if m < 12 || uint16(buf[0])<<8|uint16(buf[1]) != id {
			continue
		}
		return dnsAnswer(buf[:m]), 0
	}
}

// dnsAnswer summarises a DNS reply: the A records it carries, or its rcode.
func dnsAnswer(b []byte) string {
	rcode := int(b[3] & 0x0f)
	qd, an := int(b[4])<<8|int(b[5]), int(b[6])<<8|int(b[7])
	i := 12
	skipName := func() bool {
		for i < len(b) {
			l := int(b[i])
			switch {
			case l == 0:
				i++
				return true
			case l&0xc0 == 0xc0:
				i += 2
				return i <= len(b)
			}
			i += 1 + l
		}
		return false
	}
	for q := 0; q < qd; q++ {
		if !skipName() || i+4 > len(b) {
			return "malformed reply"
		}
		i += 4
	}
	var addrs []string
	for a := 0; a < an; a++ {
		if !skipName() || i+10 > len(b) {
			break
		}
		typ, rdlen := int(b[i])<<8|int(b[i+1]), int(b[i+8])<<8|int(b[i+9])
		i += 10
		if i+rdlen > len(b) {
			break
		}
		if typ == 1 && rdlen == 4 {
			addrs = append(addrs, strconv.Itoa(int(b[i]))+"."+strconv.Itoa(int(b[i+1]))+"."+strconv.Itoa(int(b[i+2]))+"."+strconv.Itoa(int(b[i+3])))
		}
		i += rdlen
	}
	if len(addrs) > 0 {
		return "resolved " + strings.Join(addrs, " ")
	}
	return "no answer (rcode " + strconv.Itoa(rcode) + ")"
}

// parseIP parses an IPv4 or IPv6 address (without a zone) into 4 or 16
// bytes, or returns nil.
func parseIP(s string) []byte {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil || a.Zone() != "":
		return nil
	case a.Is4():
		b := a.As4()
		return b[:]
	}
	b := a.As16()
	return b[:]
}
