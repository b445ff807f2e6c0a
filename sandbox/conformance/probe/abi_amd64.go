package main

import "syscall"

// foreignABI returns the attempts of system calls of another ABI than the
// native one, which the profile's filter must kill: on amd64, getpid of the
// x32 ABI (the native number with __X32_SYSCALL_BIT set), an architecture
// the profile does not list.
func foreignABI() []sysAttempt {
	const x32SyscallBit = 0x40000000
	return []sysAttempt{{name: "x32_getpid", calls: []rawCall{{nr: x32SyscallBit | syscall.SYS_GETPID}}}}
}
