// Command probe is the in-sandbox half of the driver conformance suite
// (package conformance). It is delivered into a sandbox exactly like user
// code and run as `probe SUBCOMMAND [ARG...]`; each subcommand tries what
// hostile code would try and prints one JSON object on stdout describing
// what it observed. It never judges: the suite on the host asserts.
//
// It must be built static (CGO_ENABLED=0) so that it runs in any image, and
// it must never crash on a refusal: every failed attempt is reported as an
// errno (0 meaning the attempt succeeded).
//
//	caps                 capability sets, no_new_privs, seccomp mode, ids
//	fs                   writes to the image, /tmp and /proc/sys, mknod in
//	                     /tmp, /tmp filled to ENOSPC,
//	                     mount flags, /dev entries, mounts
//	net ADDR...          interfaces, a TCP connect to each host:port and to
//	                     its own loopback, ICMP sockets, low and free ports
//	env [CANARY_HEX]     the environment, and every readable /proc/*/environ
//	                     and /proc/*/cmdline scanned for the canary
//	pids                 visible processes
//	syscalls             system calls the profile must refuse: the errno of
//	                     each attempt and the filter's verdict on it
//	forkbomb [MAX [HOLD_MS]]  fork until refused, hold, kill the children
//	alloc MIB            allocate and touch MIB mebibytes
//	spin | sleep SECONDS [TAG]  print "started", then busy-loop or sleep
//	busy N SECONDS MARKER  start N processes busy-looping for SECONDS
//	                     (MARKER in their argv), print "started", wait
//	                     for them, then print the wall time and their CPU
//	                     time as the sandbox's kernel counts it
//	daemon MARKER [HOLD] double-fork a setsid daemon sleeping 300 s with
//	                     MARKER in its argv, print its pid and the pids
//	                     findproc sees, then exit 0 (or print "started"
//	                     and sleep HOLD seconds first)
//	findproc MARKER      the other processes with MARKER in their argv
//	flood BYTES [stdout|stderr|both]  write BYTES of output
//	writefile PATH [CONTENT] | readfile PATH
//	mark PATH SECONDS    write PATH, print "started", sleep
//	seeothers            list /tmp and the visible processes
//	exit CODE | stdin    exit with CODE | echo stdin
//	reach HOST:PORT      the blast-radius survey (see reach.go): environment
//	                     names, privileges, namespaces, mounts, a walk of the
//	                     filesystem, /dev, unix sockets, outbound attempts
//	                     (TCP to HOST:PORT and to the metadata address, DNS),
//	                     visible limits; only ever inside a sandbox, as its
//	                     attempts would leave a host
//	pidlimit MAX [PACE_US]  the sandbox's tasks, then fork sleeping children
//	                     until refused (PACE_US apart, default 0), with
//	                     "forked N" on stderr after each
//	fds                  the open descriptors and what each is, but the
//	                     one the listing reads
//	killparent           send the parent (the guest) every signal but
//	                     SIGKILL, SIGSTOP and the synchronous faults
package main

import (
	"bytes"
	"io"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe SUBCOMMAND [ARG...]")
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "caps":
		emit(caps())
	case "fs":
		emit(fsProbe())
	case "net":
		emit(netProbe(args))
	case "env":
		emit(envProbe(args))
	case "pids":
		emit(obj{{"self", os.Getpid()}, {"procs", procs()}})
	case "syscalls":
		emit(syscallsProbe())
	case "forkbomb":
		max, hold := 1024, int64(2000)
		if len(args) > 0 {
			max = atoi(args[0])
		}
		if len(args) > 1 {
			hold = int64(atoi(args[1]))
		}
		emit(forkbomb(max, hold))
	case "alloc":
		emit(alloc(atoi(arg(args, 0, "MIB"))))
	case "spin":
		writeAll(1, []byte("started\n"))
		for {
		}
	case "sleep":
		sleep(args)
	case "busy":
		emit(busy(atoi(arg(args, 0, "N")), atoi(arg(args, 1, "SECONDS")), arg(args, 2, "MARKER")))
	case "busy-one":
		end := time.Now().Add(time.Duration(atoi(arg(args, 0, "SECONDS"))) * time.Second)
		for time.Now().Before(end) {
		}
	case "daemon":
		emit(daemon(arg(args, 0, "MARKER")))
		if len(args) > 1 {
			// Stay running, so that the daemon is alive while the Exec is.
			writeAll(1, []byte("started\n"))
			time.Sleep(time.Duration(atoi(args[1])) * time.Second)
		}
	case "daemon-mid":
		daemonMid(arg(args, 0, "MARKER"))
	case "findproc":
		emit(obj{{"pids", findProcs(arg(args, 0, "MARKER"))}})
	case "fds":
		emit(obj{{"fds", openFDs()}})
	case "flood":
		stream := "stdout"
		if len(args) > 1 {
			stream = args[1]
		}
		flood(atoi(arg(args, 0, "BYTES")), stream)
	case "writefile":
		content := "stockade-probe"
		if len(args) > 1 {
			content = args[1]
		}
		p := arg(args, 0, "PATH")
		o := obj{{"path", p}}
		emit(append(o, attempt(os.WriteFile(p, []byte(content), 0o644))...))
	case "readfile":
		p := arg(args, 0, "PATH")
		b, err := readLimited(p, 64<<10)
		o := obj{{"path", p}}
		o = append(o, attempt(err)...)
		emit(append(o, field{"content", string(b)}))
	case "mark":
		p := arg(args, 0, "PATH")
		if err := os.WriteFile(p, []byte("mark"), 0o644); err != nil {
			fail("writing " + p + ": " + err.Error())
		}
		writeAll(1, []byte("started\n"))
		time.Sleep(time.Duration(atoi(arg(args, 1, "SECONDS"))) * time.Second)
		emit(obj{{"path", p}})
	case "seeothers":
		emit(obj{{"self", os.Getpid()}, {"tmp", listDir("/tmp")}, {"procs", procs()}})
	case "exit":
		code := atoi(arg(args, 0, "CODE"))
		emit(obj{{"exit", code}})
		os.Exit(code)
	case "stdin":
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 4<<20))
		o := obj{{"stdin", string(b)}, {"bytes", len(b)}}
		emit(append(o, attempt(err)...))
	case "reach":
		emit(reach(arg(args, 0, "HOST:PORT")))
	case "pidlimit":
		pace := int64(0)
		if len(args) > 1 {
			pace = int64(atoi(args[1]))
		}
		emit(pidlimit(atoi(arg(args, 0, "MAX")), pace))
	case "killparent":
		emit(killParent())
	default:
		fail("unknown subcommand " + strconv.Quote(os.Args[1]))
	}
}

func arg(args []string, i int, name string) string {
	if i >= len(args) {
		fail("missing argument " + name)
	}
	return args[i]
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fail("bad number " + strconv.Quote(s))
	}
	return n
}

// readLimited reads at most max bytes of path.
func readLimited(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}

func readTrim(path string) string {
	b, _ := readLimited(path, 64<<10)
	return strings.TrimSpace(string(b))
}

func listDir(dir string) []string {
	ents, err := os.ReadDir(dir)
	names := []string{}
	if err != nil {
		return names
	}
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// statusFields parses a /proc/PID/status file into key -> value.
func statusFields(path string) map[string]string {
	m := map[string]string{}
	b, _ := readLimited(path, 64<<10)
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func hex64(v uint64) string {
	s := strconv.FormatUint(v, 16)
	return strings.Repeat("0", 16-len(s)) + s
}

// caps reports the capability sets both as /proc/self/status shows them and
// as the system calls do (gVisor's status has no CapAmb or NoNewPrivs line).
func caps() obj {
	st := statusFields("/proc/self/status")
	status := obj{}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Seccomp_filters", "Uid", "Gid", "Groups"} {
		if v, ok := st[k]; ok {
			status = append(status, field{k, v})
		}
	}
	o := obj{{"status", status}}

	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	err := unix.Capget(&hdr, &data[0])
	o = append(o, field{"capget", append(obj{
		{"effective", hex64(uint64(data[0].Effective) | uint64(data[1].Effective)<<32)},
		{"permitted", hex64(uint64(data[0].Permitted) | uint64(data[1].Permitted)<<32)},
		{"inheritable", hex64(uint64(data[0].Inheritable) | uint64(data[1].Inheritable)<<32)},
	}, attempt(err)...)})

	// The bounding and ambient sets, one capability at a time, up to the
	// first number the kernel does not know.
	var bnd, amb uint64
	var bndErr, ambErr error
	checked := 0
	for c := 0; c < 64; c++ {
		r, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil {
			if c == 0 {
				bndErr = err
			}
			break
		}
		checked++
		if r == 1 {
			bnd |= 1 << c
		}
		r, err = unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c), 0, 0)
		if err != nil {
			if c == 0 {
				ambErr = err
			}
			continue
		}
		if r == 1 {
			amb |= 1 << c
		}
	}
	o = append(o,
		field{"caps_checked", checked},
		field{"bounding", append(obj{{"value", hex64(bnd)}}, attempt(bndErr)...)},
		field{"ambient", append(obj{{"value", hex64(amb)}}, attempt(ambErr)...)},
	)

	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	o = append(o, field{"no_new_privs", append(obj{{"value", nnp}}, attempt(err)...)})
	sec, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0)
	o = append(o, field{"seccomp", append(obj{{"value", sec}}, attempt(err)...)})

	groups, _ := syscall.Getgroups()
	if groups == nil {
		groups = []int{}
	}
	return append(o,
		field{"uid", syscall.Getuid()}, field{"euid", syscall.Geteuid()},
		field{"gid", syscall.Getgid()}, field{"egid", syscall.Getegid()},
		field{"groups", groups},
	)
}

// fsProbe tries to write where the profile forbids it, fills /tmp, and
// reports mount flags, /dev and the mount table.
func fsProbe() obj {
	var writes []obj
	try := func(path, op string, err error) {
		o := obj{{"path", path}, {"op", op}}
		writes = append(writes, append(o, attempt(err)...))
	}
	create := func(p string) {
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
			unix.Unlink(p)
		}
		try(p, "create", err)
	}
	// openWrite opens an existing file for writing without truncating it
	// and writes nothing: success alone is the finding.
	openWrite := func(p string) {
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		try(p, "open_write", err)
	}
	mkdir := func(p string) {
		err := unix.Mkdir(p, 0o755)
		if err == nil {
			unix.Rmdir(p)
		}
		try(p, "mkdir", err)
	}
	for _, p := range []string{
		"/.stockade-probe", "/etc/.stockade-probe", "/usr/bin/.stockade-probe",
		"/.stockade/.stockade-probe", "/var/tmp/.stockade-probe",
		"/tmp/.stockade-probe", "/dev/.stockade-probe", "/dev/shm/.stockade-probe",
	} {
		create(p)
	}
	mkdir("/.stockade-probe-dir")
	mkdir("/usr/.stockade-probe-dir")
	// A device node (1:3, null) where nodev should make it useless, and a
	// FIFO, which needs no privilege, to show that mknod reaches /tmp.
	mknod := func(p string, mode uint32, dev int) {
		err := unix.Mknod(p, mode, dev)
		if err == nil {
			unix.Unlink(p)
		}
		try(p, "mknod", err)
	}
	mknod("/tmp/.stockade-probe-dev", unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3)))
	mknod("/tmp/.stockade-probe-fifo", unix.S_IFIFO|0o600, 0)
	for _, p := range []string{
		"/.stockade/guest", "/etc/passwd", "/bin/busybox",
		"/proc/sysrq-trigger", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/uevent_helper",
		// The process's own comm is writable by it: the control that an
		// open for writing in /proc can succeed.
		"/proc/self/comm",
	} {
		openWrite(p)
	}
	try("/tmp", "chmod", unix.Chmod("/tmp", 0o777))

	var mounts []obj
	for _, p := range []string{"/", "/etc", "/usr/bin", "/.stockade/guest", "/tmp", "/proc", "/proc/sys", "/sys", "/dev", "/dev/shm"} {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		o := obj{
			{"path", p}, {"flags", int64(st.Flags)},
			{"ro", st.Flags&unix.ST_RDONLY != 0}, {"nosuid", st.Flags&unix.ST_NOSUID != 0},
			{"nodev", st.Flags&unix.ST_NODEV != 0}, {"noexec", st.Flags&unix.ST_NOEXEC != 0},
			{"size", int64(st.Blocks) * st.Bsize}, {"type", "0x" + strconv.FormatInt(st.Type, 16)},
		}
		mounts = append(mounts, append(o, attempt(err)...))
	}

	return obj{
		{"writes", writes},
		{"proc_sys", procSysWrites()},
		{"statfs", mounts},
		{"tmp_fill", fillTmp()},
		{"dev", devEntries()},
		{"mounts", mountinfo()},
	}
}

// procSysWrites opens every regular file below /proc/sys for writing
// (without truncating, writing nothing: success alone is the finding) and
// reports how many it tried, which opened and the errnos of the others.
func procSysWrites() obj {
	tried := 0
	writable := []string{}
	errnos := map[string]int{}
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		for _, name := range listDir(dir) {
			p := dir + "/" + name
			var st unix.Stat_t
			if unix.Lstat(p, &st) != nil {
				continue
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				if depth < 8 {
					walk(p, depth+1)
				}
			case unix.S_IFREG:
				tried++
				fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
				if err == nil {
					unix.Close(fd)
					writable = append(writable, p)
				} else {
					errnos[unix.ErrnoName(errnoOf(err))]++
				}
			}
		}
	}
	walk("/proc/sys", 0)
	names := make([]string, 0, len(errnos))
	for k := range errnos {
		names = append(names, k)
	}
	sort.Strings(names)
	counts := obj{}
	for _, k := range names {
		counts = append(counts, field{k, errnos[k]})
	}
	return obj{{"tried", tried}, {"writable", writable}, {"errnos", counts}}
}

// fillTmp writes to a file in /tmp until the write fails (at most 4 GiB),
// reports how much was written and why it stopped, and removes the file.
func fillTmp() obj {
	const path = "/tmp/.stockade-probe-fill"
	var written int64
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err == nil {
		buf := bytes.Repeat([]byte{'f'}, 64<<10)
		for written < 4<<30 {
			var n int
			n, err = unix.Write(fd, buf)
			if err == unix.EINTR {
				continue
			}
			if n > 0 {
				written += int64(n)
			}
			if err != nil {
				break
			}
			if n == 0 {
				err = unix.EIO
				break
			}
		}
		unix.Close(fd)
		unix.Unlink(path)
	}
	return append(obj{{"written", written}}, attempt(err)...)
}

// devEntries lists /dev and one level below it, with each node's type and
// device number.
func devEntries() []obj {
	var out []obj
	var walk func(dir, prefix string, depth int)
	walk = func(dir, prefix string, depth int) {
		for _, name := range listDir(dir) {
			p := dir + "/" + name
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				out = append(out, append(obj{{"name", prefix + name}, {"type", "unknown"}}, attempt(err)...))
				continue
			}
			typ := "other"
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFCHR:
				typ = "char"
			case unix.S_IFBLK:
				typ = "block"
			case unix.S_IFDIR:
				typ = "dir"
			case unix.S_IFLNK:
				typ = "symlink"
			case unix.S_IFREG:
				typ = "file"
			case unix.S_IFSOCK:
				typ = "socket"
			case unix.S_IFIFO:
				typ = "fifo"
			}
			o := obj{{"name", prefix + name}, {"type", typ}}
			if typ == "char" || typ == "block" {
				o = append(o, field{"major", int(unix.Major(st.Rdev))}, field{"minor", int(unix.Minor(st.Rdev))})
			}
			out = append(out, o)
			if typ == "dir" && depth == 0 {
				walk(p, prefix+name+"/", 1)
			}
		}
	}
	walk("/dev", "", 0)
	return out
}

// mountinfo parses /proc/self/mountinfo.
func mountinfo() []obj {
	var out []obj
	b, _ := readLimited("/proc/self/mountinfo", 1<<20)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		sep := -1
		for i, s := range f {
			if s == "-" {
				sep = i
				break
			}
		}
		if len(f) < 6 || sep < 0 || sep+3 > len(f) {
			continue
		}
		out = append(out, obj{
			{"mount_point", unescape(f[4])}, {"root", unescape(f[3])}, {"options", f[5]},
			{"fstype", f[sep+1]}, {"source", unescape(f[sep+2])}, {"super_options", strings.Join(f[sep+3:], " ")},
		})
	}
	return out
}

// unescape undoes mountinfo's octal escapes (\040 for space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// netProbe lists interfaces three ways and tries a TCP connection to each
// address.
func netProbe(addrs []string) obj {
	links, linkErr := netlinkNames()
	var procNet []string
	b, _ := readLimited("/proc/net/dev", 64<<10)
	for i, line := range strings.Split(string(b), "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok && i >= 2 {
			procNet = append(procNet, strings.TrimSpace(name))
		}
	}
	if procNet == nil {
		procNet = []string{}
	}
	ifaddrs, addrErr := netlinkAddrs()
	var connects []obj
	for _, a := range addrs {
		connects = append(connects, tcpConnect(a))
	}
	return obj{
		{"netlink", append(obj{{"names", links}}, attempt(linkErr)...)},
		{"proc_net_dev", procNet},
		{"sys_class_net", listDir("/sys/class/net")},
		{"addresses", append(obj{{"addrs", ifaddrs}}, attempt(addrErr)...)},
		{"connect", connects},
		{"loopback_connect", loopbackConnect()},
		{"udp_socket", obj(attempt(socketOf(unix.AF_INET, unix.SOCK_DGRAM, 0)))},
		{"ping_socket", obj(attempt(socketOf(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)))},
		{"ping6_socket", obj(attempt(socketOf(unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_ICMPV6)))},
		// The kernels read the protocol as 32 bits: with garbage in the
		// high ones it is still ICMP.
		{"ping_socket_high_bits", obj(attempt(socketOf(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP|1<<32)))},
		{"high_port", obj(attempt(bindPort(0)))},
		{"low_port", obj(attempt(bindPort(80)))},
	}
}

// socketOf opens a socket with a raw system call (the protocol as the
// caller gives it, all 64 bits) and closes it. Unprivileged ICMP sockets
// are allowed by the kernel only to groups in net.ipv4.ping_group_range.
func socketOf(domain, typ int, protocol uint64) error {
	fd, _, e := syscall.RawSyscall(syscall.SYS_SOCKET, uintptr(domain), uintptr(typ|unix.SOCK_CLOEXEC), uintptr(protocol))
	if e != 0 {
		return e
	}
	syscall.Close(int(fd))
	return nil
}

// bindPort binds a TCP socket to 127.0.0.1:port. Below
// net.ipv4.ip_unprivileged_port_start that needs CAP_NET_BIND_SERVICE;
// port 0 (any free port) is the control that binding works at all.
func bindPort(port int) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
}

// loopbackConnect listens on the sandbox's own loopback and connects to it
// the way tcpConnect tries the host: the control that a connection that can
// be made is reported as "connected".
func loopbackConnect() obj {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return obj{{"addr", ""}, {"result", "socket: " + unix.ErrnoName(errnoOf(err))}, {"errno", int(errnoOf(err))}}
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return obj{{"addr", ""}, {"result", "bind: " + unix.ErrnoName(errnoOf(err))}, {"errno", int(errnoOf(err))}}
	}
	if err := syscall.Listen(fd, 1); err != nil {
		return obj{{"addr", ""}, {"result", "listen: " + unix.ErrnoName(errnoOf(err))}, {"errno", int(errnoOf(err))}}
	}
	sa, err := syscall.Getsockname(fd)
	in4, ok := sa.(*syscall.SockaddrInet4)
	if err != nil || !ok {
		return obj{{"addr", ""}, {"result", "getsockname failed"}, {"errno", -1}}
	}
	return tcpConnect(netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)).String())
}

func netlinkNames() ([]string, error) {
	names := []string{}
	tab, err := syscall.NetlinkRIB(syscall.RTM_GETLINK, syscall.AF_UNSPEC)
	if err != nil {
		return names, err
	}
	msgs, err := syscall.ParseNetlinkMessage(tab)
	if err != nil {
		return names, err
	}
	for i := range msgs {
		if msgs[i].Header.Type != syscall.RTM_NEWLINK {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&msgs[i])
		if err != nil {
			continue
		}
		for _, a := range attrs {
			if a.Attr.Type == syscall.IFLA_IFNAME {
				names = append(names, string(bytes.TrimRight(a.Value, "\x00")))
			}
		}
	}
	return names, nil
}

func netlinkAddrs() ([]string, error) {
	out := []string{}
	tab, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_UNSPEC)
	if err != nil {
		return out, err
	}
	msgs, err := syscall.ParseNetlinkMessage(tab)
	if err != nil {
		return out, err
	}
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != syscall.RTM_NEWADDR || len(m.Data) < syscall.SizeofIfAddrmsg {
			continue
		}
		ifa := (*syscall.IfAddrmsg)(unsafe.Pointer(&m.Data[0]))
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			continue
		}
		for _, a := range attrs {
			if a.Attr.Type != syscall.IFA_ADDRESS {
				continue
			}
			if ip, ok := netip.AddrFromSlice(a.Value); ok {
				out = append(out, ip.String()+"/"+strconv.Itoa(int(ifa.Prefixlen))+" index "+strconv.Itoa(int(ifa.Index)))
			}
		}
	}
	return out, nil
}

// tcpConnect tries to connect to addr ("ip:port") for at most 2 s. The
// result is "connected", "timeout" or the errno's name.
func tcpConnect(addr string) obj {
	o := obj{{"addr", addr}}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return append(o, field{"result", "bad address"}, field{"errno", -1})
	}
	var sa unix.Sockaddr
	family := unix.AF_INET
	if ap.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return append(o, field{"result", "socket: " + unix.ErrnoName(errnoOf(err))}, field{"errno", int(errnoOf(err))})
	}
	defer unix.Close(fd)
	err = unix.Connect(fd, sa)
	if err == unix.EINPROGRESS {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, perr := unix.Poll(pfd, 2000)
		switch {
		case perr != nil:
			err = perr
		case n == 0:
			return append(o, field{"result", "timeout"}, field{"errno", -1})
		default:
			var soErr int
			soErr, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
			if err == nil && soErr != 0 {
				err = syscall.Errno(soErr)
			}
		}
	}
	if err == nil {
		return append(o, field{"result", "connected"}, field{"errno", 0})
	}
	e := errnoOf(err)
	return append(o, field{"result", unix.ErrnoName(e)}, field{"errno", int(e)})
}

// envProbe reports the environment and scans it and every /proc/*/environ
// and /proc/*/cmdline for the canary, given hex-encoded so that it is not
// in this process's own command line.
func envProbe(args []string) obj {
	env := os.Environ()
	if env == nil {
		env = []string{}
	}
	o := obj{{"environ", env}}
	if len(args) == 0 {
		return o
	}
	c, ok := unhex(args[0])
	if !ok || len(c) == 0 {
		fail("bad canary " + strconv.Quote(args[0]))
	}
	hits, unreadable := []string{}, []string{}
	for _, kv := range env {
		if strings.Contains(kv, string(c)) {
			hits = append(hits, "environ")
		}
	}
	scanned := 0
	for _, name := range listDir("/proc") {
		if _, err := strconv.Atoi(name); err != nil {
			continue
		}
		for _, f := range []string{"environ", "cmdline"} {
			p := "/proc/" + name + "/" + f
			b, err := readLimited(p, 4<<20)
			if err != nil {
				unreadable = append(unreadable, p+": "+unix.ErrnoName(errnoOf(err)))
				continue
			}
			scanned++
			if bytes.Contains(b, c) {
				hits = append(hits, p)
			}
		}
	}
	return append(o, field{"hits", hits}, field{"scanned", scanned}, field{"unreadable", unreadable})
}

// unhex decodes lower- or upper-case hex (encoding/hex would pull in fmt).
func unhex(s string) ([]byte, bool) {
	if len(s)%2 != 0 {
		return nil, false
	}
	out := make([]byte, len(s)/2)
	for i := range out {
		n, err := strconv.ParseUint(s[2*i:2*i+2], 16, 8)
		if err != nil {
			return nil, false
		}
		out[i] = byte(n)
	}
	return out, true
}

// ignoreSignal sets sig's disposition to SIG_IGN in the kernel (os/signal
// would pull in more than the probe needs).
func ignoreSignal(sig syscall.Signal) {
	act := [4]uint64{1} // struct sigaction: handler SIG_IGN, flags, restorer, mask
	syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0)
}

// killParent sends the parent every signal but SIGKILL and SIGSTOP, which
// Linux and gVisor never let reach PID 1 from inside, and the synchronous
// faults (SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV, SIGSTKFLT, SIGSYS),
// which crash the guest on purpose. It then waits for a signal that ends the
// parent to take effect, and reports the signals the kernel refused.
func killParent() obj {
	ppid := os.Getppid()
	var sent []int
	var refused []obj
	for sig := syscall.Signal(1); sig <= 64; sig++ {
		switch sig {
		case syscall.SIGKILL, syscall.SIGSTOP, syscall.SIGILL, syscall.SIGTRAP, syscall.SIGBUS,
			syscall.SIGFPE, syscall.SIGSEGV, syscall.SIGSTKFLT, syscall.SIGSYS:
			continue
		}
		if err := syscall.Kill(ppid, sig); err != nil {
			refused = append(refused, append(obj{{"signal", int(sig)}}, attempt(err)...))
			continue
		}
		sent = append(sent, int(sig))
	}
	time.Sleep(200 * time.Millisecond)
	return obj{{"parent", ppid}, {"sent", sent}, {"refused", refused}}
}

// procs lists the processes visible in /proc.
func procs() []obj {
	var pids []int
	for _, name := range listDir("/proc") {
		if pid, err := strconv.Atoi(name); err == nil {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	out := []obj{}
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid)
		st := statusFields(dir + "/status")
		ppid, _ := strconv.Atoi(st["PPid"])
		uid := -1
		if f := strings.Fields(st["Uid"]); len(f) > 0 {
			uid, _ = strconv.Atoi(f[0])
		}
		cmd, _ := readLimited(dir+"/cmdline", 4096)
		out = append(out, obj{
			{"pid", pid}, {"ppid", ppid}, {"uid", uid}, {"comm", readTrim(dir + "/comm")},
			{"cmdline", strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))},
		})
	}
	return out
}

// alloc maps and touches mib mebibytes, 16 MiB at a time, reporting progress
// on stderr.
func alloc(mib int) obj {
	const chunk = 16 << 20
	var total int
	var err error
	for total < mib<<20 {
		n := min(chunk, mib<<20-total)
		var b []byte
		b, err = unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			break
		}
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		total += n
		writeAll(2, []byte("allocated "+strconv.Itoa(total>>20)+" MiB\n"))
	}
	return append(obj{{"allocated_mib", total >> 20}}, attempt(err)...)
}

// sleep prints "started" and sleeps. With a tag (the daemon's marker) it
// also ignores the signals a polite shutdown sends, as daemons do.
func sleep(args []string) {
	secs := atoi(arg(args, 0, "SECONDS"))
	if len(args) > 1 {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT} {
			ignoreSignal(sig)
		}
	}
	writeAll(1, []byte("started\n"))
	time.Sleep(time.Duration(secs) * time.Second)
	emit(obj{{"slept", secs}})
}

// daemon starts `probe daemon-mid MARKER` in a new session; that process
// starts the daemon (`probe sleep 300 MARKER`) with its stdio on /dev/null,
// writes its pid to us and exits, so the daemon is orphaned.
func daemon(marker string) obj {
	r, w, err := os.Pipe()
	if err != nil {
		fail("pipe: " + err.Error())
	}
	null, err := os.OpenFile("/dev/null", os.O_RDWR, 0)
	if err != nil {
		fail("opening /dev/null: " + err.Error())
	}
	mid, err := syscall.ForkExec("/proc/self/exe", []string{"probe", "daemon-mid", marker}, &syscall.ProcAttr{
		Files: []uintptr{null.Fd(), w.Fd(), null.Fd()},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	w.Close()
	if err != nil {
		return append(obj{{"pid", 0}, {"alive", false}}, attempt(err)...)
	}
	out, _ := io.ReadAll(io.LimitReader(r, 64))
	ws, _ := reap(mid)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	alive := pid > 0 && unix.Kill(pid, 0) == nil
	cmd, _ := readLimited("/proc/"+strconv.Itoa(pid)+"/cmdline", 4096)
	return obj{
		{"pid", pid}, {"mid_pid", mid}, {"mid_exit", ws.ExitStatus()}, {"alive", alive},
		{"cmdline", strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))},
		{"seen", findProcs(marker)},
		{"errno", 0}, {"err", ""},
	}
}

// busy starts n processes that busy-loop for seconds, each with marker
// in its argv, and waits for them. It reports the wall time from their
// start to the last one's end and the CPU time (user and system) the
// sandbox's kernel counted for them.
func busy(n, seconds int, marker string) obj {
	null, err := os.OpenFile("/dev/null", os.O_RDWR, 0)
	if err != nil {
		fail("opening /dev/null: " + err.Error())
	}
	start := time.Now()
	var pids []int
	for range n {
		pid, err := syscall.ForkExec("/proc/self/exe", []string{"probe", "busy-one", strconv.Itoa(seconds), marker}, &syscall.ProcAttr{
			Files: []uintptr{null.Fd(), null.Fd(), null.Fd()},
		})
		if err != nil {
			fail("starting a busy process: " + err.Error())
		}
		pids = append(pids, pid)
	}
	writeAll(1, []byte("started\n"))
	for _, pid := range pids {
		if _, err := reap(pid); err != nil {
			fail("waiting for a busy process: " + err.Error())
		}
	}
	wall := time.Since(start)
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		fail("getrusage: " + err.Error())
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return obj{{"processes", len(pids)}, {"wall_ms", wall.Milliseconds()}, {"cpu_ms", cpu.Milliseconds()}}
}

// findProcs lists the processes other than this one whose command line has
// marker as an argument, as a scan of /proc finds them.
func findProcs(marker string) []int {
	pids := []int{}
	for _, name := range listDir("/proc") {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, _ := readLimited("/proc/"+name+"/cmdline", 4096)
		for _, a := range strings.Split(string(cmd), "\x00") {
			if a == marker {
				pids = append(pids, pid)
				break
			}
		}
	}
	sort.Ints(pids)
	return pids
}

// openFDs lists the process's open descriptors with their /proc links,
// leaving out the one it reads the list through.
func openFDs() []obj {
	dir, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fail("opening /proc/self/fd: " + err.Error())
	}
	f := os.NewFile(uintptr(dir), "/proc/self/fd")
	names, err := f.Readdirnames(-1)
	if err != nil {
		fail("listing /proc/self/fd: " + err.Error())
	}
	fds := []obj{}
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd == dir {
			continue
		}
		link, err := os.Readlink("/proc/self/fd/" + n)
		if err != nil {
			link = "unreadable: " + err.Error()
		}
		fds = append(fds, obj{{"fd", fd}, {"target", link}})
	}
	f.Close()
	return fds
}

func daemonMid(marker string) {
	null, err := os.OpenFile("/dev/null", os.O_RDWR, 0)
	if err != nil {
		os.Exit(1)
	}
	pid, err := syscall.ForkExec("/proc/self/exe", []string{"probe", "sleep", "300", marker}, &syscall.ProcAttr{
		Files: []uintptr{null.Fd(), null.Fd(), null.Fd()},
	})
	if err != nil {
		os.Exit(1)
	}
	writeAll(1, []byte(strconv.Itoa(pid)+"\n"))
	os.Exit(0)
}

// flood writes n bytes to stdout, stderr, or n to each.
func flood(n int, stream string) {
	var fds []int
	switch stream {
	case "stdout":
		fds = []int{1}
	case "stderr":
		fds = []int{2}
	case "both":
		fds = []int{1, 2}
	default:
		fail("bad stream " + strconv.Quote(stream))
	}
	buf := bytes.Repeat([]byte{'x'}, 32<<10)
	left := make([]int, len(fds))
	for i := range left {
		left[i] = n
	}
	for more := true; more; {
		more = false
		for i, fd := range fds {
			if left[i] == 0 {
				continue
			}
			k := min(left[i], len(buf))
			w, err := syscall.Write(fd, buf[:k])
			if err != nil && err != syscall.EINTR {
				left[i] = 0
				continue
			}
			left[i] -= max(w, 0)
			more = more || left[i] > 0
		}
	}
}
