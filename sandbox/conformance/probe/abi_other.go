//go:build !amd64

package main

// foreignABI returns no attempt: a process of this architecture has no
// other ABI to call the kernel with.
func foreignABI() []sysAttempt { return nil }
