package main

import (
	"syscall"
	"unsafe"
)

// kernelSigaction is struct sigaction as the rt_sigaction system call takes
// it on linux/amd64.
type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

const sigIgn = 1 // SIG_IGN; SIG_DFL is 0

// resetIgnoredSignals sets every signal still ignored after catchSignals
// back to its default action. The runtime installs no handler for signals
// 32 and 34 (libc's, which Go leaves alone) nor for the job-control ones, so
// an inherited SIG_IGN would otherwise pass on to every program through
// execve. Go has no API for it: the
// dispositions are read and set with rt_sigaction directly.
func resetIgnoredSignals() {
	for sig := uintptr(1); sig <= 64; sig++ {
		if sig == uintptr(syscall.SIGKILL) || sig == uintptr(syscall.SIGSTOP) {
			continue
		}
		var old kernelSigaction
		if _, _, errno := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, sig, 0, uintptr(unsafe.Pointer(&old)), 8, 0, 0); errno != 0 {
			continue
		}
		if old.handler == sigIgn {
			dfl := kernelSigaction{}
			syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, sig, uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0)
		}
	}
}
