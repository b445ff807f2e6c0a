package ocidriver

import "time"

// CPUUsage is the CPU time the sandbox's cgroup has used since the
// sandbox was created or restored: on gVisor its Sentry's and gofer's,
// on runc its processes'. The runtime's own commands and the shim are
// not in it. The engine reads it to report what a pool's refill costs.
func (s *sbx) CPUUsage() time.Duration { return s.cg.CPUUsage() }
