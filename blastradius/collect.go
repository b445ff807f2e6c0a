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
	reach    rawReach
	pids     rawPidLimit
	alloc    rawAlloc
	allocRes sandbox.Result // the allocation's Exec result (status, stderr)
	// allocMiB is the allocation the probe attempted.
	allocMiB int
	// pidsMax is the number of children the probe tried to fork.
	pidsMax int

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

// allocHeadroom is how much beyond the memory limit the probe tries to
// allocate: enough to cross the limit however the tier accounts memory.
const allocHeadroom = 64 << 20

// pidsHeadroom is how many processes beyond the limit the probe tries to
// start.
const pidsHeadroom = 64

// collect runs the probe's subcommands in sb with env and gathers their
// reports. The process and memory limits are measured against the record's
// limits rec; the memory run goes last, as it may end the sandbox.
func collect(ctx context.Context, sb *engine.Session, gz []byte, env []string, rec sandbox.Limits) (*observed, error) {
	u, ok := probeexec.UnpackerFor(sb.Runtime.Name)
	if !ok {
		return nil, fmt.Errorf("no way to unpack the probe in the %s image", sb.Runtime.Name)
	}
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
	ictx, cancel := context.WithTimeout(ctx, installTimeout)
	err = probeexec.Install(ictx, sb, gz, u)
	cancel()
	if err != nil {
		return nil, err
	}
	run := func(timeout time.Duration, v any, args ...string) (*sandbox.Result, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout+time.Minute)
		defer cancel()
		res, err := sb.Exec(ctx, probeexec.Request(sandbox.ExecRequest{Env: env, Timeout: timeout}, args...))
		if err != nil {
			return nil, fmt.Errorf("running the probe (%s): %w", args[0], err)
		}
		if v != nil {
			if err := probeexec.Decode(res, v); err != nil {
				return nil, fmt.Errorf("probe %s: %w", args[0], err)
			}
		}
		return res, nil
	}
	if _, err := run(reachTimeout, &o.reach, "reach", o.listenAddr); err != nil {
		return nil, err
	}
	o.pidsMax = int(rec.Pids) + pidsHeadroom
	if _, err := run(pidsTimeout, &o.pids, "pidlimit", strconv.Itoa(o.pidsMax)); err != nil {
		return nil, err
	}
	o.allocMiB = int((rec.Memory + allocHeadroom) >> 20)
	res, err := run(allocTimeout, nil, "alloc", strconv.Itoa(o.allocMiB))
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
		o.alloc.AllocatedMiB = lastAllocated(res.Stderr)
	}
	// A connection that got through would need a moment to be accepted.
	time.Sleep(100 * time.Millisecond)
	o.accepted = accepted.Load()
	return o, nil
}

// lastAllocated returns N from the last "allocated N MiB" line the probe's
// alloc wrote on stderr.
func lastAllocated(stderr []byte) int {
	n := 0
	for _, line := range strings.Split(string(stderr), "\n") {
		if v, ok := strings.CutPrefix(line, "allocated "); ok {
			if m, err := strconv.Atoi(strings.TrimSuffix(v, " MiB")); err == nil {
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
