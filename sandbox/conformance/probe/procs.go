package main

import (
	"bytes"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds the subcommands of the environment, signals and
// processes: env, killparent, pids, alloc, sleep, daemon, busy,
// findproc, fds and flood.

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
