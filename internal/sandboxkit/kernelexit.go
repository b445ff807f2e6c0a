package sandboxkit

// Exit says how the kernel ended: its exit code and the signal that
// killed it (0 when none), and ok false while it runs or when the guest
// connection ended before the guest reported it. A SIGKILL alone does not
// say who sent it (the kernel's own code may have): OOMKilled does.
func (k *kernel) Exit() (code, signal int, ok bool) {
	x := k.k.Exit()
	if x == nil {
		return 0, 0, false
	}
	return x.ExitCode, x.Signal, true
}

// OOMKilled reports whether the kernel's evidence says the last cell ended
// in an OOM kill: the sandbox's memory cgroup counted one since the cell
// started (memory.events' oom_kill on v2, memory.oom_control's on v1).
// Under gVisor the cgroup holds the whole sandbox, whose Sentry the host
// kills: the guest's stream ends with it, and the cell is lost with its
// sandbox rather than reported here.
func (k *kernel) OOMKilled() bool {
	return k.g.Cgroup.OOMKills() > k.oomBefore.Load()
}
