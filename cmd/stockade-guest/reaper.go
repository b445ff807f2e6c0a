package main

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/guest"
)

// The guest is the only reaper of the sandbox. As PID 1 it inherits every
// orphan (outside a PID namespace it is made their subreaper), so one
// goroutine blocked in wait4(-1) collects every process that ends and
// routes its status by pid: to the exec whose program it is, to the kernel
// it is, or to the running exec's account as a stray. Nothing else in the
// guest may wait: os/exec's Cmd.Wait beside a wait4(-1) loop would race for
// a status.
//
// The reaper's goroutine holds a thread while it waits (1-2 ms to start
// under gVisor), so it runs only while the guest has children: it ends on
// ECHILD and start starts it again with the next child.
//
// Process lifetime: when an exec ends (its program exited, it was
// cancelled, or the host went away), sweep kills every child of the guest
// that is not a live kernel, again and again until none is left: the
// exec's orphans reparent to the guest as their parents die and are caught
// by the next round, and a fork bomb converges because the pids cgroup
// bounds it and every kill is final. A kernel is started through the
// kernel wrapper, which makes it the subreaper of its own tree: its
// processes never reparent to the guest, and so survive the sweeps. When
// no kernel lives, kill(-1) is the one-call fast path (as PID 1 only: it
// reaches every process of the namespace but the guest itself). A kernel
// that clears its own subreaper flag loses only its own strays, which the
// next sweep kills: the same tenant's processes, in the same sandbox.

type reaper struct {
	mu sync.Mutex
	// owners receive the status of the pids they started; kernels are the
	// pids of live kernel processes, which sweeps spare.
	owners  map[int]func(ws syscall.WaitStatus, ru *syscall.Rusage)
	kernels map[int]bool
	// stray, when set, receives the status of every other process (the
	// running exec's account).
	stray   func(ws syscall.WaitStatus, ru *syscall.Rusage)
	running bool
	forks   uint64
	// reaped is signalled after every reap and when the reaper stops, for
	// a sweep that waits for its kills to take effect.
	reaped chan struct{}
}

func (r *reaper) init() {
	r.owners = map[int]func(syscall.WaitStatus, *syscall.Rusage){}
	r.kernels = map[int]bool{}
	r.reaped = make(chan struct{}, 1)
}

// start runs fork (a ForkExec) and registers the child's owner before the
// reaper can see the child's status, then makes sure the reaper runs.
// kernel marks the child as a kernel process.
func (r *reaper) start(fork func() (int, error), kernel bool, owner func(syscall.WaitStatus, *syscall.Rusage)) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, err
	}
	r.owners[pid] = owner
	if kernel {
		r.kernels[pid] = true
	}
	r.forks++
	if !r.running {
		r.running = true
		go r.loop()
	}
	return pid, nil
}

// setStray sets (or, with nil, clears) the receiver of strays' statuses.
func (r *reaper) setStray(f func(syscall.WaitStatus, *syscall.Rusage)) {
	r.mu.Lock()
	r.stray = f
	r.mu.Unlock()
}

func (r *reaper) loop() {
	for {
		r.mu.Lock()
		seen := r.forks
		r.mu.Unlock()
		var ws syscall.WaitStatus
		var ru syscall.Rusage
		pid, err := syscall.Wait4(-1, &ws, 0, &ru)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			// ECHILD: no child is left. A child forked since seen was
			// read must not be missed: start saw running and did not
			// start another loop.
			r.mu.Lock()
			if r.forks != seen {
				r.mu.Unlock()
				continue
			}
			r.running = false
			r.mu.Unlock()
			r.notify()
			return
		}
		r.mu.Lock()
		owner, ok := r.owners[pid]
		delete(r.owners, pid)
		delete(r.kernels, pid)
		if !ok {
			owner = r.stray
		}
		r.mu.Unlock()
		if owner != nil {
			owner(ws, &ru)
		}
		r.notify()
	}
}

func (r *reaper) notify() {
	select {
	case r.reaped <- struct{}{}:
	default:
	}
}

// sweep kills every child of the guest but the live kernel processes (all
// of them unless keepKernels: the guest is exiting), until none is left,
// reaped, or within has passed.
func (a *agent) sweep(keepKernels bool, within time.Duration) {
	deadline := time.Now().Add(within)
	r := &a.reaper
	for {
		r.mu.Lock()
		var keep map[int]bool
		if keepKernels {
			keep = r.kernels
		}
		left := 0
		if a.init && len(keep) == 0 {
			// The fast path: one kill reaches every process but the
			// guest, and the reaper's ECHILD says when all are reaped.
			syscall.Kill(-1, syscall.SIGKILL)
			if r.running {
				left = 1
			}
		} else {
			for _, c := range children(a.self) {
				if keep[c.pid] {
					continue
				}
				left++
				if !c.zombie {
					syscall.Kill(c.pid, syscall.SIGKILL)
				}
			}
		}
		r.mu.Unlock()
		if left == 0 || time.Now().After(deadline) {
			return
		}
		// Killed processes become zombies and are reaped; their orphans
		// reparent to the guest and are killed in the next round.
		select {
		case <-r.reaped:
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// stopAll stops every process of the sandbox but the guest, as PID 1
// through kill(-1, SIGSTOP), and waits until /proc shows every thread of
// each stopped or dead in two scans in a row, at most within. It holds
// a.mu, so that no program or kernel starts meanwhile, and stops nothing
// where a kernel runs (its processes must go on) or the guest is not
// PID 1 (kill(-1) would reach beyond the sandbox). A scan is not one
// instant: a process read as stopped could be continued (SIGCONT) by one
// read later, before that one stopped; the second scan, with no signal
// sent between, would find it running. A stopped process runs again only
// when continued, which no stopped process can do. It returns whether
// every process is stopped.
func (a *agent) stopAll(within time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := &a.reaper
	r.mu.Lock()
	kernels := len(r.kernels)
	r.mu.Unlock()
	if !a.init || kernels > 0 || !procIsOurs() {
		return false
	}
	deadline := time.Now().Add(within)
	for round := 0; ; round++ {
		// Again each round: a process forked as the last round's signal
		// went out missed it.
		syscall.Kill(-1, syscall.SIGSTOP)
		if allStopped(a.self) && allStopped(a.self) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		// A signalled process stops as soon as it runs, unless it is in
		// an uninterruptible sleep: give it the CPU for a moment, in this
		// thread (a time.Sleep of microseconds can wake a millisecond
		// late: the runtime's poller sleeps in whole milliseconds), then
		// less often.
		if round < 20 {
			ts := syscall.Timespec{Nsec: 20_000}
			syscall.Nanosleep(&ts, nil)
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}

// allStopped says whether /proc shows every thread of every process but
// self stopped or dead. Each thread: a process whose main thread has
// exited shows a zombie in /proc/<pid>/stat while its other threads run.
// /proc/<pid>/stat is read first: its state is the main thread's, and a
// process of one thread (num_threads, field 20) that it shows stopped is
// its thread stopped, so its task directory is read only for a process
// of several threads, or a zombie. Under gVisor each of the guest's system
// calls costs tens of microseconds or more on a busy host, and a pool's
// interpreter that gave notice is such a process of one thread: a scan of
// it takes 7 calls (the listing's open, two getdents and close; the stat
// file's open, read and close) instead of the 14 of a full read.
func allStopped(self int) bool {
	names, err := procNames()
	if err != nil {
		return false
	}
	var buf [512]byte
	for _, n := range names {
		if n[0] < '0' || n[0] > '9' || n == strconv.Itoa(self) {
			continue
		}
		b, err := readProcLine("/proc/"+n+"/stat", buf[:])
		if err != nil {
			continue // gone
		}
		switch processStopped(b) {
		case notStopped:
			return false
		case stopped:
			continue
		}
		tasks, err := dirNames("/proc/" + n + "/task")
		if err != nil {
			continue // gone
		}
		for _, tid := range tasks {
			if tid == n {
				continue // the main thread, read above
			}
			b, err := readProcLine("/proc/"+n+"/task/"+tid+"/stat", buf[:])
			if err != nil {
				continue // gone
			}
			if f := statFields(b); len(f) == 0 || len(f[0]) != 1 || !bytes.ContainsAny(f[0], "TtZX") {
				return false
			}
		}
	}
	return true
}

// What /proc/<pid>/stat says of a process's threads (processStopped).
const (
	notStopped   = iota // its main thread runs (or the line is unreadable)
	stopped             // its one thread is stopped
	readTheTasks        // its main thread is stopped or dead; it has others
)

// processStopped reads a line of /proc/<pid>/stat (see allStopped).
func processStopped(stat []byte) int {
	f := statFields(stat)
	switch {
	case len(f) == 0 || len(f[0]) != 1 || !bytes.ContainsAny(f[0], "TtZX"):
		return notStopped
	case bytes.ContainsAny(f[0], "Tt") && len(f) > 17 && string(f[17]) == "1":
		return stopped
	}
	return readTheTasks
}

type child struct {
	pid    int
	zombie bool
}

// procIsOurs says whether /proc shows the guest's PID namespace. It does in
// every sandbox; a test that runs the guest in a PID namespace of its own
// without mounting a /proc for it sees the host's, whose pids must never be
// signalled: children then finds none.
var procIsOurs = sync.OnceValue(func() bool {
	self, err := os.Readlink("/proc/self")
	return err == nil && self == strconv.Itoa(os.Getpid())
})

// children lists the processes whose parent is pid, from /proc.
func children(pid int) []child {
	if !procIsOurs() {
		return nil
	}
	names, _ := procNames()
	var out []child
	for _, n := range names {
		if n[0] < '0' || n[0] > '9' {
			continue
		}
		p, err := strconv.Atoi(n)
		if err != nil || p == pid {
			continue
		}
		ppid, state, ok := procStat(n)
		if ok && ppid == pid {
			out = append(out, child{pid: p, zombie: state == 'Z' || state == 'X'})
		}
	}
	return out
}

// procStat reads the parent pid and the state of a process from
// /proc/<pid>/stat. The command name may contain any byte but ends with the
// last ')'.
func procStat(pid string) (ppid int, state byte, ok bool) {
	var buf [512]byte
	b, err := readProcLine("/proc/"+pid+"/stat", buf[:])
	if err != nil {
		return 0, 0, false
	}
	f := statFields(b)
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(string(f[1]))
	return ppid, f[0][0], err == nil
}

// readProc reads a file of /proc whole into buf (grown if need be). It
// opens and reads it with plain system calls: the guest reads /proc in the
// loops of a sweep and after an exit notice, where os.ReadFile would also
// try (and fail) to add each file to the runtime's poller, several system
// calls more each time.
func readProc(path string, buf []byte) ([]byte, error) { return readProcFile(path, buf, false) }

// readProcLine reads a file of /proc that holds one line, such as
// /proc/<pid>/stat, as readProc does, but stops at the read that ends the
// line instead of reading once more for the end of the file: a system call
// fewer, each of which costs tens of microseconds in a gVisor sandbox that
// has idled. A stat line's command name may hold a newline; its first
// read (of at least minLineRead bytes, procfs giving all it has) reaches
// past the name, so such a newline never ends a read.
func readProcLine(path string, buf []byte) ([]byte, error) { return readProcFile(path, buf, true) }

// minLineRead is readProcLine's smallest read: more than a pid, a command
// name of up to 15 bytes and the characters around them.
const minLineRead = 64

func readProcFile(path string, buf []byte, line bool) ([]byte, error) {
	if line && len(buf) < minLineRead {
		buf = make([]byte, minLineRead)
	}
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	n := 0
	for {
		if n == len(buf) {
			buf = append(buf, make([]byte, max(len(buf), 512))...)
		}
		m, err := syscall.Read(fd, buf[n:])
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return nil, err
		case m == 0:
			return buf[:n], nil
		}
		n += m
		if line && buf[n-1] == '\n' {
			return buf[:n], nil
		}
	}
}

// procNames lists /proc.
func procNames() ([]string, error) { return dirNames("/proc") }

// dirNames lists a directory of /proc, opened and read as readProc reads
// its files (os.NewFile would ask the descriptor's flags first).
func dirNames(path string) ([]string, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := syscall.ReadDirent(fd, buf)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return nil, err
		case n <= 0:
			return names, nil
		}
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
	}
}

// statFields splits /proc/<pid>/stat after the command name, which may
// contain any byte but ends with the last ')': its state first, then its
// parent pid, and so on (proc(5) field 3 onwards).
func statFields(b []byte) [][]byte {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return nil
	}
	return bytes.Fields(b[i+2:])
}

// usage accumulates the resource usage of the processes reaped for one
// exec: its program (whose own figures include the descendants it waited
// for) and the strays reaped while it ran or was swept.
type usage struct {
	utime, stime time.Duration
	maxRSS       int64 // kilobytes
}

func (u *usage) add(ru *syscall.Rusage) {
	u.utime += timeval(ru.Utime)
	u.stime += timeval(ru.Stime)
	u.maxRSS = max(u.maxRSS, ru.Maxrss)
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every
// Linux ABI the guest is built for, and under gVisor.
const clockTick = 10 * time.Millisecond

// addProc adds the usage of a live (stopped) process from /proc, where
// getrusage's figures are not to be had before it is reaped: its own and
// its waited-for children's times (proc(5) fields 14-17, in clock ticks)
// and its peak resident set (VmHWM; the current one, VmRSS, where /proc
// has no peak, as under gVisor).
func (u *usage) addProc(pid int) {
	p := "/proc/" + strconv.Itoa(pid)
	buf := make([]byte, 4096)
	if b, err := readProcLine(p+"/stat", buf); err == nil {
		if f := statFields(b); len(f) >= 15 {
			var ticks [4]time.Duration
			for i := range ticks {
				n, _ := strconv.ParseInt(string(f[11+i]), 10, 64)
				ticks[i] = time.Duration(max(n, 0)) * clockTick
			}
			u.utime += ticks[0] + ticks[2]
			u.stime += ticks[1] + ticks[3]
		}
	}
	b, err := readProc(p+"/status", buf)
	if err != nil {
		return
	}
	var hwm, rss int64
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
		if err != nil {
			continue
		}
		switch string(k) {
		case "VmHWM":
			hwm = kb
		case "VmRSS":
			rss = kb
		}
	}
	if hwm == 0 {
		hwm = rss
	}
	u.maxRSS = max(u.maxRSS, hwm)
}

// report is the ExitReport of u, without the exit status.
func (u usage) report(cancelled bool) guest.ExitReport {
	return guest.ExitReport{
		CPUUserUs:   u.utime.Microseconds(),
		CPUSysUs:    u.stime.Microseconds(),
		MaxRSSBytes: u.maxRSS * 1024,
		Cancelled:   cancelled,
	}
}

func timeval(tv syscall.Timeval) time.Duration {
	return time.Duration(tv.Sec)*time.Second + time.Duration(tv.Usec)*time.Microsecond
}
