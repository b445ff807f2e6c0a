package sandboxkit

// Exit says how the kernel ended: its exit code and the signal that
// killed it (0 when none), and ok false while it runs or when the guest
// connection ended before the guest reported it. A kernel killed by
// SIGKILL that no Stop asked for was killed by the sandbox's OOM killer.
func (k *kernel) Exit() (code, signal int, ok bool) {
	x := k.k.Exit()
	if x == nil {
		return 0, 0, false
	}
	return x.ExitCode, x.Signal, true
}
