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

// inChild runs calls in a raw child and returns the errno of the last one
// (0 if it succeeded). A failed earlier call is reported as note.
//
//go:noinline
//go:norace
func inChild(calls []rawCall) (errno syscall.Errno, note string) {
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
		return 0, "fork for the attempt failed: " + unix.ErrnoName(e)
	}
	ws, err := reap(int(pid))
	switch {
	case err != nil:
		return 0, "waiting for the attempt's child: " + err.Error()
	case ws.Signaled():
		return 0, "the attempt's child was killed by signal " + strconv.Itoa(int(ws.Signal()))
	case ws.ExitStatus() >= setupBase:
		return 0, "setup call " + strconv.Itoa(ws.ExitStatus()-setupBase) + " failed in the attempt's child"
	}
	return syscall.Errno(ws.ExitStatus()), ""
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

func cstr(s string) uintptr {
	p, err := unix.BytePtrFromString(s)
	if err != nil {
		fail("bad string " + strconv.Quote(s))
	}
	return uintptr(unsafe.Pointer(p))
}

// syscallsProbe attempts each system call the security profile must refuse,
// with arguments that would make it succeed for an unprivileged process on a
// kernel without the profile, and reports each errno.
func syscallsProbe() obj {
	var results []obj
	add := func(name string, e syscall.Errno, note string) {
		o := obj{{"name", name}}
		if note != "" {
			// The attempt could not be made; -1 says so.
			o = append(o, field{"errno", -1}, field{"err", ""}, field{"note", note})
		} else {
			o = append(o, errf(e)...)
		}
		results = append(results, o)
	}
	closeOK := func(r uintptr, e syscall.Errno) syscall.Errno {
		if e == 0 {
			unix.Close(int(r))
		}
		return e
	}

	// io_uring_setup(1, &params): allowed unprivileged unless
	// kernel.io_uring_disabled says otherwise.
	var params [120]byte
	r, _, e := syscall.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
	add("io_uring_setup", closeOK(r, e), "")

	// userfaultfd(UFFD_USER_MODE_ONLY): allowed unprivileged since 5.11.
	const uffdUserModeOnly = 1
	r, _, e = syscall.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly, 0, 0)
	add("userfaultfd", closeOK(r, e), "")

	// bpf(BPF_MAP_CREATE, array map of one 4-byte entry).
	var battr [128]byte
	*(*uint32)(unsafe.Pointer(&battr[0])) = unix.BPF_MAP_TYPE_ARRAY
	*(*uint32)(unsafe.Pointer(&battr[4])) = 4
	*(*uint32)(unsafe.Pointer(&battr[8])) = 4
	*(*uint32)(unsafe.Pointer(&battr[12])) = 1
	r, _, e = syscall.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&battr)), uintptr(len(battr)))
	add("bpf", closeOK(r, e), "")

	// perf_event_open of a software clock on this process, user space only.
	pattr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_CPU_CLOCK,
		Bits:   unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	pattr.Size = uint32(unsafe.Sizeof(pattr))
	fd, err := unix.PerfEventOpen(&pattr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err == nil {
		unix.Close(fd)
	}
	add("perf_event_open", errnoOf(err), "")

	// keyctl(KEYCTL_GET_KEYRING_ID, session keyring), add_key to the
	// process keyring, request_key without a callout.
	sessionKeyring, processKeyring := unix.KEY_SPEC_SESSION_KEYRING, unix.KEY_SPEC_PROCESS_KEYRING
	_, _, e = syscall.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(sessionKeyring), 0)
	add("keyctl", e, "")
	user, desc, payload := cstr("user"), cstr("stockade-probe"), cstr("x")
	_, _, e = syscall.Syscall6(unix.SYS_ADD_KEY, user, desc, payload, 1, uintptr(processKeyring), 0)
	add("add_key", e, "")
	_, _, e = syscall.Syscall6(unix.SYS_REQUEST_KEY, user, cstr("stockade-probe-absent"), 0, 0, 0, 0)
	add("request_key", e, "")

	// ptrace: TRACEME, SEIZE of PID 1 (both from a child, which detaches by
	// exiting), and SEIZE of our own paused child, which Yama's default
	// scope allows to an unprivileged parent.
	e, note := inChild([]rawCall{{nr: syscall.SYS_PTRACE, args: [6]uintptr{unix.PTRACE_TRACEME}}})
	add("ptrace_traceme", e, note)
	e, note = inChild([]rawCall{{nr: syscall.SYS_PTRACE, args: [6]uintptr{unix.PTRACE_SEIZE, 1}}})
	add("ptrace_seize_pid1", e, note)
	e, note = seizeOwnChild()
	add("ptrace_seize_child", e, note)

	// process_vm_readv of our own memory: always allowed without a filter.
	secret := [8]byte{'s', 'e', 'c', 'r', 'e', 't'}
	var got [8]byte
	_, err = unix.ProcessVMReadv(os.Getpid(),
		[]unix.Iovec{{Base: &got[0], Len: uint64(len(got))}},
		[]unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&secret[0])), Len: len(secret)}}, 0)
	runtime.KeepAlive(&secret)
	add("process_vm_readv", errnoOf(err), "")

	// Namespaces, from single-threaded children.
	e, note = inChild([]rawCall{{nr: syscall.SYS_UNSHARE, args: [6]uintptr{unix.CLONE_NEWUSER}}})
	add("unshare_newuser", e, note)
	e, note = inChild([]rawCall{{nr: syscall.SYS_UNSHARE, args: [6]uintptr{unix.CLONE_NEWNS}}})
	add("unshare_newns", e, note)
	e, note = inChild([]rawCall{{nr: syscall.SYS_UNSHARE, args: [6]uintptr{unix.CLONE_NEWNET}}})
	add("unshare_newnet", e, note)
	add("clone_newuser", rawForkExit(syscall.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(syscall.SIGCHLD), 0), "")
	if nsfd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		add("setns", 0, "opening /proc/self/ns/net: "+err.Error())
	} else {
		e, note = inChild([]rawCall{{nr: unix.SYS_SETNS, args: [6]uintptr{uintptr(nsfd), unix.CLONE_NEWNET}}})
		add("setns", e, note)
		unix.Close(nsfd)
	}

	// clone3 with fork semantics, then with a new user namespace; the
	// child exits at once.
	var cargs [11]uint64 // struct clone_args, CLONE_ARGS_SIZE_VER2
	cargs[4] = uint64(syscall.SIGCHLD)
	add("clone3", rawForkExit(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&cargs)), unsafe.Sizeof(cargs)), "")
	cargs[0] = unix.CLONE_NEWUSER
	add("clone3_newuser", rawForkExit(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&cargs)), unsafe.Sizeof(cargs)), "")
	runtime.KeepAlive(&cargs)

	// mount a tmpfs, from a child, on a directory of our own tmpfs.
	const mnt = "/tmp/.stockade-probe-mnt"
	if err := unix.Mkdir(mnt, 0o700); err != nil && err != unix.EEXIST {
		add("mount", 0, "creating the mount point: "+err.Error())
	} else {
		e, note = inChild([]rawCall{{nr: syscall.SYS_MOUNT, args: [6]uintptr{cstr("none"), cstr(mnt), cstr("tmpfs"), 0, cstr("size=1m")}}})
		add("mount", e, note)
		if e == 0 && note == "" {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		unix.Rmdir(mnt)
	}
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err == nil {
		unix.Close(fsfd)
	}
	add("fsopen", errnoOf(err), "")

	// Socket families outside the allow-list.
	for _, s := range []struct {
		name                  string
		domain, typ, protocol int
	}{
		{"socket_af_alg", unix.AF_ALG, unix.SOCK_SEQPACKET, 0},
		{"socket_af_packet", unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL))},
		{"socket_af_vsock", unix.AF_VSOCK, unix.SOCK_STREAM, 0},
	} {
		fd, err := unix.Socket(s.domain, s.typ|unix.SOCK_CLOEXEC, s.protocol)
		if err == nil {
			unix.Close(fd)
		}
		add(s.name, errnoOf(err), "")
	}

	e, note = tiocsti(unix.TIOCSTI)
	add("ioctl_tiocsti", e, note)
	// The kernel reads the request as 32 bits: with garbage in the high
	// bits it is still TIOCSTI, which a 64-bit comparison misses.
	e, note = tiocsti(unix.TIOCSTI | 1<<32)
	add("ioctl_tiocsti_high_bits", e, note)

	return obj{{"results", results}}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// seizeOwnChild attaches with PTRACE_SEIZE (which does not stop the tracee)
// to a paused child of ours, then kills it.
func seizeOwnChild() (syscall.Errno, string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	old := blockSignals()
	pid, e := forkPauser()
	restoreSignals(old)
	if e != 0 {
		return 0, "forking the tracee: " + unix.ErrnoName(e)
	}
	_, _, e = syscall.RawSyscall6(syscall.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, 0, 0, 0)
	unix.Kill(pid, unix.SIGKILL)
	reap(pid)
	return e, ""
}

// tiocsti tries to push a byte into the input of a terminal that is the
// controlling terminal of the caller: a new pty's slave, opened by a child
// that made itself a session leader. Without the filter this succeeds (where
// dev.tty.legacy_tiocsti is on). Without a pty it falls back to stdin. req
// is the ioctl request, TIOCSTI in its low 32 bits.
func tiocsti(req uintptr) (syscall.Errno, string) {
	c := byte('#')
	ptmx, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		_, _, e := syscall.Syscall(syscall.SYS_IOCTL, 0, req, uintptr(unsafe.Pointer(&c)))
		return e, ""
	}
	defer unix.Close(ptmx)
	if err := unix.IoctlSetPointerInt(ptmx, unix.TIOCSPTLCK, 0); err != nil {
		return 0, "unlocking the pty: " + err.Error()
	}
	n, err := unix.IoctlGetUint32(ptmx, unix.TIOCGPTN)
	if err != nil {
		return 0, "getting the pty number: " + err.Error()
	}
	atFDCWD := unix.AT_FDCWD
	e, note := inChild([]rawCall{
		{nr: syscall.SYS_SETSID},
		{nr: syscall.SYS_OPENAT, args: [6]uintptr{uintptr(atFDCWD), cstr("/dev/pts/" + strconv.FormatUint(uint64(n), 10)), unix.O_RDWR}},
		{nr: syscall.SYS_IOCTL, args: [6]uintptr{0, req, uintptr(unsafe.Pointer(&c))}, prev: true},
	})
	runtime.KeepAlive(&c)
	return e, note
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
