package blastradius

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/probeexec"
	"github.com/stockade-sh/stockade/sandbox"
)

// observed is everything one audit gathered: the probe's reports from
// inside the sandbox and what the host saw meanwhile.
type observed struct {
	reach rawReach

	// pids is the fork test's report; when the test ended its sandbox,
	// pidsRes says how and pids holds what its progress lines said.
	pids    rawPidLimit
	pidsRes sandbox.Result
	// pidsMax is the number of children the probe tried to fork.
	pidsMax int

	// alloc is the memory test's report, allocRes its Exec's result.
	alloc    rawAlloc
	allocRes sandbox.Result
	// allocMiB is the allocation the probe attempted.
	allocMiB int
	// sandboxes is how many sandboxes of the tool the audit used: a second
	// one when the fork test ended the first.
	sandboxes int

	listenAddr string
	accepted   int32
	hostNS     map[string]string // name -> link of the host process
}

// Time bounds of the probe's Execs, which may exceed the tool's wall clock:
// the audit is the operator's, not the tool's code.
const (
	installTimeout = 2 * time.Minute
	reachTimeout   = 3 * time.Minute
	pidsTimeout    = time.Minute
	allocTimeout   = 2 * time.Minute
)

// probeOutputCap is the least output cap the probe's reports need.
const probeOutputCap = 1 << 20

// auditLimits are the limits the audit's sandbox takes over from the
// record's: a wall clock long enough for the slowest probe and an output cap
// large enough for its reports. Neither bounds what the code can reach;
// every other limit (memory, processes, CPU, /tmp) stays the record's.
func auditLimits(record sandbox.Limits) sandbox.Limits {
	return sandbox.Limits{Timeout: max(installTimeout, reachTimeout, pidsTimeout, allocTimeout), OutputCap: max(record.OutputCap, probeOutputCap)}
}

// allocHeadroom is how much beyond the memory limit the probe tries to
// allocate: enough to cross the limit however the tier accounts memory.
const allocHeadroom = 64 << 20

// pidsHeadroom is how many processes beyond the limit the probe tries to
// start.
const pidsHeadroom = 64

// opener creates a sandbox of the audited tool with the probe installed.
// The caller must Destroy it.
type opener func(ctx context.Context) (*engine.Sandbox, error)

// collect runs the probe's subcommands in sandboxes from open, with env,
// and gathers their reports. The process and memory limits are measured
// against the record's limits rec. The fork test runs after the survey and
// the memory test last, as each may end its sandbox; a second sandbox is
// opened for the memory test when the fork test ended the first.
func collect(ctx context.Context, open opener, env []string, rec sandbox.Limits) (*observed, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("opening the loopback listener: %w", err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	o := &observed{listenAddr: ln.Addr().String(), hostNS: hostNamespaces()}

	sb, err := open(ctx)
	if err != nil {
		return nil, err
	}
	o.sandboxes++
	defer func() {
		if sb != nil {
			// Destroy must run even when ctx is cancelled; it bounds itself.
			_ = sb.Destroy(context.WithoutCancel(ctx))
		}
	}()
	run := func(timeout time.Duration, args ...string) (*sandbox.Result, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout+time.Minute)
		defer cancel()
		res, err := sandbox.Run(ctx, sb, probeexec.Request(sandbox.ExecRequest{Env: env, Timeout: timeout}, args...))
		if err != nil {
			return nil, fmt.Errorf("running the probe (%s): %w", args[0], err)
		}
		return res, nil
	}

	res, err := run(reachTimeout, "reach", o.listenAddr)
	if err != nil {
		return nil, err
	}
	if err := probeexec.Decode(res, &o.reach); err != nil {
		return nil, fmt.Errorf("probe reach: %w", err)
	}

	o.pidsMax = int(rec.Pids) + pidsHeadroom
	res, err = run(pidsTimeout, "pidlimit", strconv.Itoa(o.pidsMax))
	if err != nil {
		return nil, err
	}
	o.pidsRes = *res
	if res.Status == sandbox.StatusSucceeded {
		if err := probeexec.Decode(res, &o.pids); err != nil {
			return nil, fmt.Errorf("probe pidlimit: %w", err)
		}
	} else {
		// The sandbox ended the test: its progress lines say how far it
		// got, and the memory test needs a sandbox of its own.
		o.pids.TasksBefore = lastCount(res.Stderr, "tasks ")
		o.pids.Forked = lastCount(res.Stderr, "forked ")
		o.pids.Max = o.pidsMax
		_ = sb.Destroy(context.WithoutCancel(ctx))
		if sb, err = open(ctx); err != nil {
			return nil, err
		}
		o.sandboxes++
	}

	o.allocMiB = int((rec.Memory + allocHeadroom) >> 20)
	res, err = run(allocTimeout, "alloc", strconv.Itoa(o.allocMiB))
	if err != nil {
		return nil, err
	}
	o.allocRes = *res
	if res.Status == sandbox.StatusSucceeded {
		if err := probeexec.Decode(res, &o.alloc); err != nil {
			return nil, fmt.Errorf("probe alloc: %w", err)
		}
	} else {
		// Killed: the progress lines on stderr say how far it got.
		o.alloc.AllocatedMiB = lastCount(res.Stderr, "allocated ")
	}
	// A connection that got through would need a moment to be accepted.
	time.Sleep(100 * time.Millisecond)
	o.accepted = accepted.Load()
	return o, nil
}

// lastCount returns N from the last line "PREFIX N" or "PREFIX N UNIT" of
// the probe's stderr, or 0.
func lastCount(stderr []byte, prefix string) int {
	n := 0
	for _, line := range strings.Split(string(stderr), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			num, _, _ := strings.Cut(v, " ")
			if m, err := strconv.Atoi(num); err == nil {
				n = m
			}
		}
	}
	return n
}

// nsNames are the namespace links of /proc/self/ns the probe reads.
var nsNames = []string{"cgroup", "ipc", "mnt", "net", "pid", "pid_for_children", "time", "time_for_children", "user", "uts"}

// hostNamespaces reads this process's own namespaces, which the sandbox's
// must differ from.
func hostNamespaces() map[string]string {
	m := map[string]string{}
	for _, n := range nsNames {
		if link, err := os.Readlink("/proc/self/ns/" + n); err == nil {
			m[n] = link
		}
	}
	return m
}
