package main

import (
	"syscall"
	"unsafe"
)

// BPF and seccomp constants (linux/filter.h, linux/seccomp.h, linux/audit.h).
const (
	bpfLdWAbs  = 0x20 // BPF_LD | BPF_W | BPF_ABS
	bpfJeqK    = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	bpfRetK    = 0x06 // BPF_RET | BPF_K
	retAllow   = 0x7fff0000
	retErrno   = 0x00050000
	archX86_64 = 0xc000003e
	sysClone3  = 435

	seccompSetModeFilter = 1
	prSetNoNewPrivs      = 38
)

type sockFilter struct {
	code uint16
	jt   uint8
	jf   uint8
	k    uint32
}

type sockFprog struct {
	len    uint16
	filter *sockFilter
}

// denyClone3 makes clone3 fail with ENOSYS for the guest's main thread and
// every program it starts, on every tier. The sandbox's own profile does
// the same on the host kernel, but runsc turns every errno rule of the OCI
// profile into EPERM, so there the profile lets clone3 through to the
// Sentry — whose clone3 creates namespaces, which seccomp cannot see in
// clone3's flags. A filter a process installs itself is enforced by the
// Sentry as written, and ENOSYS makes libc fall back to clone, whose flags
// the profile checks.
// The guest itself never calls clone3 (the Go runtime uses clone).
func denyClone3() error {
	// Installing a filter without CAP_SYS_ADMIN needs no_new_privs, which
	// the runtime has set already; setting it again costs nothing.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0); errno != 0 {
		return errno
	}
	prog := []sockFilter{
		{code: bpfLdWAbs, k: 4}, // seccomp_data.arch
		{code: bpfJeqK, jt: 1, k: archX86_64},
		{code: bpfRetK, k: retAllow}, // other architectures: the profile kills them
		{code: bpfLdWAbs, k: 0},      // seccomp_data.nr
		{code: bpfJeqK, jf: 1, k: sysClone3},
		{code: bpfRetK, k: retErrno | uint32(syscall.ENOSYS)},
		{code: bpfRetK, k: retAllow},
	}
	fprog := sockFprog{len: uint16(len(prog)), filter: &prog[0]}
	// The filter applies to the calling thread, which main locked to the
	// main goroutine, and to the programs it forks. Not to the guest's
	// other threads (no TSYNC): under gVisor each filtered system call is
	// checked by the Sentry, and the runtime's background threads make
	// many; filtering them cost ~10 ms of every run.
	if _, _, errno := syscall.RawSyscall(317 /* seccomp */, seccompSetModeFilter, 0, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return errno
	}
	return nil
}
