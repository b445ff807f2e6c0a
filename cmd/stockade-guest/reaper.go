package main

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
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
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
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
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+2:])
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(string(f[1]))
	return ppid, f[0][0], err == nil
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

func timeval(tv syscall.Timeval) time.Duration {
	return time.Duration(tv.Sec)*time.Second + time.Duration(tv.Usec)*time.Microsecond
}
