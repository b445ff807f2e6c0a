package main

import (
	"os"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds the attempts of the `syscalls` and `forkbomb` subcommands
// and the raw fork helpers they need.
//
// Some attempts must run in a single-threaded process: unshare(CLONE_NEWUSER)
// and unshare(CLONE_NEWNS) fail with EINVAL in any multi-threaded process,
// which a Go program always is, and that EINVAL would pass for a refusal. So
// they run in a child made by a raw clone(SIGCHLD): a copy of this process
// with one thread, which makes only raw system calls (no Go runtime, no
// allocation, no function that can grow the stack) and reports the errno of
// its last call as its exit status. All signals are blocked around the clone
// so that no Go signal handler ever runs in such a child.

// rawCall is one system call made by a raw child.
type rawCall struct {
	nr   uintptr
	args [6]uintptr
	// prev replaces args[0] with the result of the previous call (to use a
	// file descriptor the child opened).
	prev bool
}

// Exit statuses of a raw child at or above setupBase mean that call
// status-setupBase, not the last one, failed. Errno values stay below it.
const setupBase = 200

var sigAll = ^uint64(0)

// blockSignals blocks every signal on the calling (locked) thread and
// returns the previous mask.
func blockSignals() uint64 {
	var old uint64
	syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&sigAll)), uintptr(unsafe.Pointer(&old)), 8, 0, 0)
	return old
}

func restoreSignals(old uint64) {
	syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&old)), 0, 8, 0, 0)
}

// childResult is how the calls of a raw child ended.
type childResult struct {
	errno syscall.Errno // of the last call; 0 if it succeeded
	// signal is the signal that killed the child, 0 if it exited.
	signal syscall.Signal
	// note says why the attempt could not be made (a failed fork or
	// setup call); empty if it was made.
	note string
}

// inChildResult runs calls in a raw child and reports how they ended.
//
//go:noinline
//go:norace
func inChildResult(calls []rawCall) childResult {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	old := blockSignals()
	pid, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e == 0 && pid == 0 {
		// The child: raw system calls only, then exit.
		var prev uintptr
		for i := 0; i < len(calls); i++ {
			a0 := calls[i].args[0]
			if calls[i].prev {
				a0 = prev
			}
			r, _, ce := syscall.RawSyscall6(calls[i].nr, a0, calls[i].args[1], calls[i].args[2], calls[i].args[3], calls[i].args[4], calls[i].args[5])
			if ce != 0 {
				status := uintptr(ce)
				if i < len(calls)-1 {
					status = uintptr(setupBase + i)
				}
				syscall.RawSyscall(syscall.SYS_EXIT_GROUP, status, 0, 0)
			}
			prev = r
		}
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
	}
	restoreSignals(old)
	if e != 0 {
		return childResult{note: "fork for the attempt failed: " + unix.ErrnoName(e)}
	}
	ws, err := reap(int(pid))
	switch {
	case err != nil:
		return childResult{note: "waiting for the attempt's child: " + err.Error()}
	case ws.Signaled():
		return childResult{signal: ws.Signal()}
	case ws.ExitStatus() >= setupBase:
		return childResult{note: "setup call " + strconv.Itoa(ws.ExitStatus()-setupBase) + " failed in the attempt's child"}
	}
	return childResult{errno: syscall.Errno(ws.ExitStatus())}
}

// The verdict of the sandbox's seccomp filter on a call is read without
// making the call: a raw child first installs a filter of its own that
// answers the call's number with SECCOMP_RET_TRACE and allows everything
// else, then makes the call. Linux (and the Sentry, which implements the
// same semantics) evaluates every filter and acts on the highest-precedence
// answer: KILL and ERRNO rank above TRACE, TRACE above ALLOW. So the call
// is never executed, and its result is the sandbox filter's verdict: the
// child killed (a kill rule), the rule's errno (an errno rule), or ENOSYS,
// which TRACE answers without a tracer: the sandbox filter allowed the call
// (or traced it). The overlay needs no privilege with no_new_privs set.

// bpf instructions of the overlay (linux/filter.h, linux/seccomp.h).
const (
	bpfLdWAbs         = 0x20 // BPF_LD | BPF_W | BPF_ABS
	bpfJeqK           = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	bpfRetK           = 0x06 // BPF_RET | BPF_K
	seccompRetTrace   = 0x7ff00000
	seccompRetAllow   = 0x7fff0000
	seccompModeFilter = 1 // SECCOMP_SET_MODE_FILTER
)

// overlay holds the overlay filter of one verdict; it must stay reachable
// until the child that installs it has ended.
type overlay struct {
	insns [4]unix.SockFilter
	prog  unix.SockFprog
}

// newOverlay builds the overlay filter that traces system call nr.
func newOverlay(nr uintptr) *overlay {
	o := &overlay{insns: [4]unix.SockFilter{
		{Code: bpfLdWAbs, K: 0}, // seccomp_data.nr
		{Code: bpfJeqK, Jt: 0, Jf: 1, K: uint32(nr)},
		{Code: bpfRetK, K: seccompRetTrace},
		{Code: bpfRetK, K: seccompRetAllow},
	}}
	o.prog = unix.SockFprog{Len: uint16(len(o.insns)), Filter: &o.insns[0]}
	return o
}

// verdict reports the sandbox filter's answer to the last of calls (the
// earlier ones are its setup, which must be other system calls) without
// executing it; see the overlay above.
func verdict(calls []rawCall) childResult {
	target := calls[len(calls)-1].nr
	for _, c := range calls[:len(calls)-1] {
		if c.nr == target {
			return childResult{note: "a setup call is the call under test: no verdict"}
		}
	}
	o := newOverlay(target)
	install := rawCall{nr: unix.SYS_SECCOMP, args: [6]uintptr{seccompModeFilter, 0, uintptr(unsafe.Pointer(&o.prog))}}
	r := inChildResult(append([]rawCall{install}, calls...))
	runtime.KeepAlive(o)
	if r.note != "" {
		r.note = "verdict (the overlay is setup call 0): " + r.note
	}
	return r
}

// resultFields reports r as the errno fields of an attempt, with the signal
// that killed its child.
func resultFields(r childResult) obj {
	if r.note != "" {
		return obj{{"errno", -1}, {"err", ""}, {"note", r.note}, {"signal", 0}}
	}
	return append(obj(errf(r.errno)), field{"signal", int(r.signal)})
}

// reap waits for pid to end.
func reap(pid int) (unix.WaitStatus, error) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		return ws, err
	}
}

// forkPauser makes a raw child that sleeps until it is killed. The caller
// must hold its OS thread with all signals blocked (the child inherits the
// mask, so pause never returns).
//
//go:nosplit
//go:norace
func forkPauser() (int, syscall.Errno) {
	pid, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e == 0 && pid == 0 {
		for {
			syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
		}
	}
	return int(pid), e
}

// rawForkExit makes a child with the given clone system call and arguments;
// the child exits at once. It returns the clone's errno.
//
//go:noinline
//go:norace
func rawForkExit(nr, a0, a1 uintptr) syscall.Errno {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	old := blockSignals()
	pid, _, e := syscall.RawSyscall6(nr, a0, a1, 0, 0, 0, 0)
	if e == 0 && pid == 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
	}
	restoreSignals(old)
	if e == 0 {
		reap(int(pid))
	}
	return e
}

// pinned keeps reachable what raw calls point to: a uintptr does not, and
// the attempts are built before they run. The probe is short-lived.
var pinned []any

func pin(v ...any) { pinned = append(pinned, v...) }

// cstr returns a pinned NUL-terminated copy of s.
func cstr(s string) uintptr {
	p, err := unix.BytePtrFromString(s)
	if err != nil {
		fail("bad string " + strconv.Quote(s))
	}
	pin(p)
	return uintptr(unsafe.Pointer(p))
}

// sysAttempt is one system call the profile must refuse.
type sysAttempt struct {
	name string
	// calls are raw calls: setup, then the call the profile must refuse,
	// with arguments that make it succeed for an unprivileged process on
	// a kernel without the profile. The verdict is read from them.
	calls []rawCall
	// run makes the real attempt; nil means running calls in a raw child.
	run func() childResult
	// cleanup, if set, runs after both.
	cleanup func()
}

// syscallsProbe attempts each system call the security profile must refuse
// and reports, for each, the errno of the real attempt and the sandbox
// filter's verdict on the same call (see verdict). Controls show that the
// means work here: a raw child's call that the profile allows succeeds, the
// overlay answers ENOSYS for an allowed call, and the raw fork and a socket
// of an allowed family succeed.
func syscallsProbe() obj {
	var results []obj
	for _, a := range sysAttempts() {
		run := a.run
		if run == nil {
			run = func() childResult { return inChildResult(a.calls) }
		}
		o := append(obj{{"name", a.name}}, resultFields(run())...)
		o = append(o, field{"verdict", resultFields(verdict(a.calls))})
		if a.cleanup != nil {
			a.cleanup()
		}
		results = append(results, o)
	}

	getpid := []rawCall{{nr: syscall.SYS_GETPID}}
	sockFd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		unix.Close(sockFd)
	}
	controls := []obj{
		append(obj{{"name", "raw_child_getpid"}}, resultFields(inChildResult(getpid))...),
		append(obj{{"name", "verdict_getpid"}}, resultFields(verdict(getpid))...),
		append(obj{{"name", "raw_clone"}}, errf(rawForkExit(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0))...),
		append(obj{{"name", "socket_af_inet"}}, attempt(err)...),
	}
	return obj{{"results", results}, {"controls", controls}}
}

// sysAttempts returns the attempts of syscallsProbe. Their pointer
// arguments point to pinned memory (see pin).
func sysAttempts() []sysAttempt {
	var as []sysAttempt
	add := func(a sysAttempt) { as = append(as, a) }
	call := func(nr uintptr, args ...uintptr) []rawCall {
		c := rawCall{nr: nr}
		copy(c.args[:], args)
		return []rawCall{c}
	}
	closeOK := func(calls []rawCall) func() childResult {
		return func() childResult {
			c := calls[0]
			r, _, e := syscall.Syscall6(c.nr, c.args[0], c.args[1], c.args[2], c.args[3], c.args[4], c.args[5])
			if e == 0 {
				unix.Close(int(r))
			}
			return childResult{errno: e}
		}
	}
	inProcess := func(name string, calls []rawCall) {
		add(sysAttempt{name: name, calls: calls, run: closeOK(calls)})
	}

	// io_uring_setup(1, &params): allowed unprivileged unless
	// kernel.io_uring_disabled says otherwise.
	params := new([120]byte)
	inProcess("io_uring_setup", call(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(params))))

	// userfaultfd(UFFD_USER_MODE_ONLY): allowed unprivileged since 5.11.
	const uffdUserModeOnly = 1
	inProcess("userfaultfd", call(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly))

	// bpf(BPF_MAP_CREATE, array map of one 4-byte entry).
	battr := new([128]byte)
	*(*uint32)(unsafe.Pointer(&battr[0])) = unix.BPF_MAP_TYPE_ARRAY
	*(*uint32)(unsafe.Pointer(&battr[4])) = 4
	*(*uint32)(unsafe.Pointer(&battr[8])) = 4
	*(*uint32)(unsafe.Pointer(&battr[12])) = 1
	inProcess("bpf", call(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(battr)), uintptr(len(battr))))

	// perf_event_open of a software clock on this process, user space only.
	pattr := &unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_CPU_CLOCK,
		Bits:   unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	pattr.Size = uint32(unsafe.Sizeof(*pattr))
	negOne := ^uintptr(0)
	inProcess("perf_event_open", call(unix.SYS_PERF_EVENT_OPEN, uintptr(unsafe.Pointer(pattr)), 0, negOne, negOne, unix.PERF_FLAG_FD_CLOEXEC))

	// keyctl(KEYCTL_GET_KEYRING_ID, session keyring), add_key to the
	// process keyring, request_key without a callout.
	sessionKeyring, processKeyring := unix.KEY_SPEC_SESSION_KEYRING, unix.KEY_SPEC_PROCESS_KEYRING
	user := cstr("user")
	inProcess("keyctl", call(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(sessionKeyring)))
	inProcess("add_key", call(unix.SYS_ADD_KEY, user, cstr("stockade-probe"), cstr("x"), 1, uintptr(processKeyring)))
	inProcess("request_key", call(unix.SYS_REQUEST_KEY, user, cstr("stockade-probe-absent")))

	// ptrace: TRACEME, SEIZE of PID 1 (both from a child, which detaches by
	// exiting), and SEIZE of our own paused child, which Yama's default
	// scope allows to an unprivileged parent.
	add(sysAttempt{name: "ptrace_traceme", calls: call(syscall.SYS_PTRACE, unix.PTRACE_TRACEME)})
	add(sysAttempt{name: "ptrace_seize_pid1", calls: call(syscall.SYS_PTRACE, unix.PTRACE_SEIZE, 1)})
	add(sysAttempt{name: "ptrace_seize_child", calls: call(syscall.SYS_PTRACE, unix.PTRACE_SEIZE, 1), run: seizeOwnChild})

	// process_vm_readv of our own memory: always allowed without a filter.
	secret := &[8]byte{'s', 'e', 'c', 'r', 'e', 't'}
	got := new([8]byte)
	local := &unix.Iovec{Base: &got[0], Len: uint64(len(got))}
	remote := &unix.RemoteIovec{Base: uintptr(unsafe.Pointer(&secret[0])), Len: len(secret)}
	add(sysAttempt{
		name:  "process_vm_readv",
		calls: call(unix.SYS_PROCESS_VM_READV, uintptr(os.Getpid()), uintptr(unsafe.Pointer(local)), 1, uintptr(unsafe.Pointer(remote)), 1, 0),
		run: func() childResult {
			_, _, e := syscall.Syscall6(unix.SYS_PROCESS_VM_READV, uintptr(os.Getpid()), uintptr(unsafe.Pointer(local)), 1, uintptr(unsafe.Pointer(remote)), 1, 0)
			return childResult{errno: e}
		},
	})

	// Namespaces, from single-threaded children.
	add(sysAttempt{name: "unshare_newuser", calls: call(syscall.SYS_UNSHARE, unix.CLONE_NEWUSER)})
	add(sysAttempt{name: "unshare_newns", calls: call(syscall.SYS_UNSHARE, unix.CLONE_NEWNS)})
	add(sysAttempt{name: "unshare_newnet", calls: call(syscall.SYS_UNSHARE, unix.CLONE_NEWNET)})
	cloneNewUser := call(syscall.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(syscall.SIGCHLD))
	add(sysAttempt{name: "clone_newuser", calls: cloneNewUser, run: forkWith(cloneNewUser[0])})
	if nsfd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		add(sysAttempt{name: "setns", calls: call(unix.SYS_SETNS, negOne, unix.CLONE_NEWNET), run: func() childResult {
			return childResult{note: "opening /proc/self/ns/net: " + err.Error()}
		}})
	} else {
		add(sysAttempt{name: "setns", calls: call(unix.SYS_SETNS, uintptr(nsfd), unix.CLONE_NEWNET), cleanup: func() { unix.Close(nsfd) }})
	}

	// clone3 with fork semantics, then with a new user namespace; the
	// child exits at once.
	cargs := new([11]uint64) // struct clone_args, CLONE_ARGS_SIZE_VER2
	cargs[4] = uint64(syscall.SIGCHLD)
	clone3 := call(unix.SYS_CLONE3, uintptr(unsafe.Pointer(cargs)), unsafe.Sizeof(*cargs))
	add(sysAttempt{name: "clone3", calls: clone3, run: forkWith(clone3[0])})
	cargsUser := new([11]uint64)
	cargsUser[0], cargsUser[4] = unix.CLONE_NEWUSER, uint64(syscall.SIGCHLD)
	clone3User := call(unix.SYS_CLONE3, uintptr(unsafe.Pointer(cargsUser)), unsafe.Sizeof(*cargsUser))
	add(sysAttempt{name: "clone3_newuser", calls: clone3User, run: forkWith(clone3User[0])})

	// mount a tmpfs, from a child, on a directory of our own tmpfs.
	const mnt = "/tmp/.stockade-probe-mnt"
	mount := call(syscall.SYS_MOUNT, cstr("none"), cstr(mnt), cstr("tmpfs"), 0, cstr("size=1m"))
	add(sysAttempt{
		name: "mount", calls: mount,
		run: func() childResult {
			if err := unix.Mkdir(mnt, 0o700); err != nil && err != unix.EEXIST {
				return childResult{note: "creating the mount point: " + err.Error()}
			}
			r := inChildResult(mount)
			if r == (childResult{}) {
				unix.Unmount(mnt, unix.MNT_DETACH)
			}
			return r
		},
		cleanup: func() { unix.Rmdir(mnt) },
	})
	inProcess("fsopen", call(unix.SYS_FSOPEN, cstr("tmpfs"), unix.FSOPEN_CLOEXEC))

	// Socket families outside the allow-list.
	for _, s := range []struct {
		name                  string
		domain, typ, protocol int
	}{
		{"socket_af_alg", unix.AF_ALG, unix.SOCK_SEQPACKET, 0},
		{"socket_af_packet", unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL))},
		{"socket_af_vsock", unix.AF_VSOCK, unix.SOCK_STREAM, 0},
	} {
		inProcess(s.name, call(unix.SYS_SOCKET, uintptr(s.domain), uintptr(s.typ|unix.SOCK_CLOEXEC), uintptr(s.protocol)))
	}

	add(tiocsti("ioctl_tiocsti", unix.TIOCSTI))
	// The kernel reads the request as 32 bits: with garbage in the high
	// bits it is still TIOCSTI, which a 64-bit comparison misses.
	add(tiocsti("ioctl_tiocsti_high_bits", unix.TIOCSTI|1<<32))
	as = append(as, foreignABI()...)
	pin(params, battr, pattr, secret, got, local, remote, cargs, cargsUser)
	return as
}

// forkWith makes the real attempt of a clone-like call c with rawForkExit.
func forkWith(c rawCall) func() childResult {
	return func() childResult { return childResult{errno: rawForkExit(c.nr, c.args[0], c.args[1])} }
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// seizeOwnChild attaches with PTRACE_SEIZE (which does not stop the tracee)
// to a paused child of ours, then kills it.
func seizeOwnChild() childResult {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	old := blockSignals()
	pid, e := forkPauser()
	restoreSignals(old)
	if e != 0 {
		return childResult{note: "forking the tracee: " + unix.ErrnoName(e)}
	}
	_, _, e = syscall.RawSyscall6(syscall.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, 0, 0, 0)
	unix.Kill(pid, unix.SIGKILL)
	reap(pid)
	return childResult{errno: e}
}

// tiocsti tries to push a byte into the input of a terminal that is the
// controlling terminal of the caller: a new pty's slave, opened by a child
// that made itself a session leader. Without the filter this succeeds (where
// dev.tty.legacy_tiocsti is on). Without a pty it falls back to stdin. req
// is the ioctl request, TIOCSTI in its low 32 bits.
func tiocsti(name string, req uintptr) sysAttempt {
	c := new(byte)
	*c = '#'
	pin(c)
	stdin := []rawCall{{nr: syscall.SYS_IOCTL, args: [6]uintptr{0, req, uintptr(unsafe.Pointer(c))}}}
	ptmx, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return sysAttempt{name: name, calls: stdin, run: func() childResult {
			_, _, e := syscall.Syscall(syscall.SYS_IOCTL, 0, req, uintptr(unsafe.Pointer(c)))
			return childResult{errno: e}
		}}
	}
	fail := func(note string) sysAttempt {
		unix.Close(ptmx)
		return sysAttempt{name: name, calls: stdin, run: func() childResult { return childResult{note: note} }}
	}
	if err := unix.IoctlSetPointerInt(ptmx, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlocking the pty: " + err.Error())
	}
	n, err := unix.IoctlGetUint32(ptmx, unix.TIOCGPTN)
	if err != nil {
		return fail("getting the pty number: " + err.Error())
	}
	atFDCWD := unix.AT_FDCWD
	return sysAttempt{
		name: name,
		calls: []rawCall{
			{nr: syscall.SYS_SETSID},
			{nr: syscall.SYS_OPENAT, args: [6]uintptr{uintptr(atFDCWD), cstr("/dev/pts/" + strconv.FormatUint(uint64(n), 10)), unix.O_RDWR}},
			{nr: syscall.SYS_IOCTL, args: [6]uintptr{0, req, uintptr(unsafe.Pointer(c))}, prev: true},
		},
		cleanup: func() { unix.Close(ptmx) },
	}
}

// forkbomb forks children that sleep until fork fails or max is reached,
// keeps trying for holdMs milliseconds, then kills them all and reports.
//
// While the children are alive it runs on one locked thread with signals
// blocked and calls only nosplit functions that make raw system calls: at
// the pids limit the Go runtime cannot start a thread and aborts the process
// if it tries, and a call that can be preempted may make it try.
func forkbomb(max int, holdMs int64) obj {
	runtime.GC()
	runtime.GOMAXPROCS(1)
	runtime.LockOSThread()
	pids := make([]int, 0, max)
	var firstErr syscall.Errno
	start := monoMs()
	old := blockSignals()
	for len(pids) < max {
		pid, e := forkPauser()
		if e != 0 {
			firstErr = e
			break
		}
		pids = append(pids, pid)
	}
	reached := monoMs()
	// Keep pressing on the limit for holdMs: a freed slot would be taken.
	ts := unix.Timespec{Nsec: 10 * 1000 * 1000}
	for monoMs() < reached+holdMs && len(pids) < max {
		if pid, e := forkPauser(); e == 0 {
			pids = append(pids, pid)
		}
		syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
	}
	killAndReap(pids)
	end := monoMs()
	restoreSignals(old)
	runtime.UnlockOSThread()
	o := obj{{"forked", len(pids)}, {"max", max}}
	o = append(o, errf(firstErr)...)
	return append(o, field{"limit_reached_ms", reached - start}, field{"elapsed_ms", end - start})
}

// killAndReap kills the children forkbomb and pidlimit forked and reaps
// them, with raw system calls only (see forkbomb).
//
//go:nosplit
func killAndReap(pids []int) {
	for i := 0; i < len(pids); i++ {
		syscall.RawSyscall(syscall.SYS_KILL, uintptr(pids[i]), uintptr(syscall.SIGKILL), 0)
	}
	var ws unix.WaitStatus
	for i := 0; i < len(pids); i++ {
		for {
			_, _, e := syscall.RawSyscall6(syscall.SYS_WAIT4, uintptr(pids[i]), uintptr(unsafe.Pointer(&ws)), unix.WALL, 0, 0, 0)
			if e != syscall.EINTR {
				break
			}
		}
	}
}

// monoMs reads CLOCK_MONOTONIC in milliseconds with a raw system call.
//
//go:nosplit
func monoMs() int64 {
	var ts unix.Timespec
	syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Sec*1000 + ts.Nsec/1000000
}
