package main

import (
	"syscall"

	"github.com/stockade-sh/stockade/guest"
)

// The guest is the only reaper of the sandbox. As PID 1 it inherits every
// orphan, so a wait4(-1) loop collects the program and all its descendants.
// Nothing else in the guest may wait: os/exec's Cmd.Wait (or os.Process.Wait)
// beside a wait4(-1) loop would race for the program's status. Reaping only
// runs while an exec does; between execs no process is left.

// reap waits for the program pid and returns its status, then kills every
// other process the program left behind and reaps until none is left
// (ECHILD). maxRSS is the largest peak resident set, in kilobytes, that
// wait4 reported for any process reaped here.
func (a *agent) reap(pid int) (status syscall.WaitStatus, maxRSS int64) {
	exited := false
	for {
		var ws syscall.WaitStatus
		var ru syscall.Rusage
		wpid, err := syscall.Wait4(-1, &ws, 0, &ru)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			if !exited {
				// pid is our child until we reap it: ECHILD before that
				// means something else reaped it, a bug of the guest.
				a.killAll()
				fatalf("waiting for program %d: %v", pid, err)
			}
			return status, maxRSS
		}
		maxRSS = max(maxRSS, ru.Maxrss)
		if wpid == pid && !exited {
			exited = true
			status = ws
		}
		if exited {
			// The program is gone: whatever it left behind dies with it. Kill
			// again after every reap so that a process forked while the
			// first kill was under way cannot survive.
			a.killAll()
		}
	}
}

// reapAll reaps until no child is left.
func reapAll() {
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(-1, &ws, 0, nil)
		if err != nil && err != syscall.EINTR {
			return
		}
	}
}

// killAll sends SIGKILL to every process the program may have left behind.
//
// The guard on init is deliberate and must stay: as PID 1 of the sandbox's
// PID namespace, kill(-1) reaches every other process of the namespace and
// never the guest itself, which also catches processes that left the
// program's process group (setsid, setpgid). Outside a PID namespace (tests,
// debugging on a workstation) kill(-1) would reach every process the user
// may signal on the host, so there only the program's process group is
// killed.
func (a *agent) killAll() {
	if a.init {
		syscall.Kill(-1, syscall.SIGKILL)
		return
	}
	if pgid := a.pgid.Load(); pgid > 0 {
		syscall.Kill(-int(pgid), syscall.SIGKILL)
	}
}

// childrenUsage returns the accumulated usage of every reaped descendant.
func childrenUsage() syscall.Rusage {
	var ru syscall.Rusage
	// RUSAGE_CHILDREN cannot fail with a valid pointer.
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return ru
}

// report builds the exit report of a program from its wait status and the
// children's usage before it started and after every process it left was
// reaped. The difference covers the program and all its descendants.
func report(ws syscall.WaitStatus, before, after syscall.Rusage, maxRSS int64) guest.ExitReport {
	rep := guest.ExitReport{
		CPUUserUs: max(0, micros(after.Utime)-micros(before.Utime)),
		CPUSysUs:  max(0, micros(after.Stime)-micros(before.Stime)),
	}
	// RUSAGE_CHILDREN's ru_maxrss is a maximum over the guest's lifetime:
	// it belongs to this exec only if the exec raised it. The per-process
	// maximum from wait4 is exact where the kernel reports it.
	if after.Maxrss > before.Maxrss {
		maxRSS = max(maxRSS, after.Maxrss)
	}
	rep.MaxRSSBytes = max(0, maxRSS) * 1024
	switch {
	case ws.Signaled():
		rep.ExitCode = -1
		rep.Signal = int(ws.Signal())
	default:
		// Without WUNTRACED the only other status is a normal exit.
		rep.ExitCode = ws.ExitStatus()
	}
	return rep
}

func micros(tv syscall.Timeval) int64 {
	return int64(tv.Sec)*1_000_000 + int64(tv.Usec)
}
