package main

import (
	"fmt"
	"syscall"
	"unsafe"
)

// The guest sets its signal dispositions with rt_sigaction directly. Go's
// os/signal would catch signals too, but it starts a thread of the runtime's
// own for that and makes a round trip to it per signal: under gVisor a
// thread takes 1-2 ms to start, and the guest starts in every sandbox.

// kernelSigaction is struct sigaction as the rt_sigaction system call takes
// it on linux/amd64 and linux/arm64.
type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

const (
	saRestorer = 0x04000000
	saOnstack  = 0x08000000
	saRestart  = 0x10000000
)

// sigDropPC and sigReturnPC are the addresses of sigDrop, a signal handler
// that returns at once, and of sigReturn, its restorer (signals_amd64.s,
// signals_arm64.s).
var sigDropPC, sigReturnPC uintptr

func rtSigaction(sig syscall.Signal, act, old *kernelSigaction) syscall.Errno {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(act)), uintptr(unsafe.Pointer(old)), 8, 0, 0)
	return errno
}

// dropSignals makes the guest survive the signals that would otherwise end
// or stop it.
//
// Code in the sandbox runs with the guest's uid and, inside the PID
// namespace, may signal PID 1. Linux delivers only the signals for which
// PID 1 has a handler (and never SIGKILL and SIGSTOP from inside); gVisor
// delivers the others too. The Go runtime installs its handler for nearly
// every signal at start; for most of them (SIGUSR1, SIGALRM, SIGPIPE, the
// real-time signals from 35, ...) that handler does nothing, but SIGHUP,
// SIGINT and SIGTERM make it exit and SIGQUIT and SIGABRT make it crash. It
// leaves 32 and 34 (libc's) and the job-control stops at their defaults,
// which end or stop a process. All of those get sigDrop instead, which
// drops them. Signal 33 keeps the runtime's handler: the runtime sends it
// to its own threads to run a system call on each (syscall.Setuid and the
// like), and the handler ignores a 33 that no such call is waiting for. SIGHUP and SIGINT are the runtime's exceptions to installing
// a handler: it respects an inherited SIG_IGN for them, which would pass on
// to every program; a handled signal is reset to the default by execve in
// every child.
//
// sigDrop runs on the thread's alternate signal stack, which the runtime
// sets up for every thread (SA_ONSTACK: never on a goroutine's small
// stack), and interrupted system calls restart. The runtime sets a
// disposition again only for os/signal, which the guest does not use, and
// to die of a signal when it crashes: it raises the signal under the
// current handler (sigDrop drops it), then sets the default and raises it
// again. A synchronous-fault signal sent on purpose (SIGTRAP, SIGSYS, ...)
// still crashes the guest, which ends the sandbox: a denial of service of
// the attacker's own box only.
func dropSignals() error {
	// Every signal is blocked while sigDrop runs, as while the runtime's
	// handler runs: a flood of signals would otherwise nest their frames
	// on the alternate stack until it overflows.
	act := kernelSigaction{handler: sigDropPC, flags: saOnstack | saRestart | saRestorer, restorer: sigReturnPC, mask: ^uint64(0)}
	for _, sig := range []syscall.Signal{
		syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGABRT, syscall.SIGTERM,
		32, 34, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
	} {
		if errno := rtSigaction(sig, &act, nil); errno != 0 {
			return fmt.Errorf("setting the handler of %v: %v", sig, errno)
		}
	}
	return nil
}

// resetIgnoredSignals sets SIGCONT back to its default action, since an
// inherited SIG_IGN would pass on to every program through execve. It is
// the one signal whose inherited disposition neither the runtime nor
// dropSignals replaces: the runtime installs its handler for every other
// signal but SIGHUP, SIGINT, the job-control stops and signals 32 and 34
// (runtime/sigtab_linux_generic.go), which dropSignals sets. Setting SIGCONT
// alone is one system call where reading every signal back was 64, each
// 12-24 µs under gVisor; TestInheritedIgnoredSignals starts the guest with
// every signal ignored and fails if the runtime ever leaves another one.
func resetIgnoredSignals() {
	rtSigaction(syscall.SIGCONT, &kernelSigaction{}, nil)
}
