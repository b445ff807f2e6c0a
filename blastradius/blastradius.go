// Package blastradius audits what code running as a tool could reach: it
// creates the tool's real sandbox through the engine, runs a probe in it
// that tries what hostile code would try (docs/design.md §8), and compares
// every finding with the tool's isolation record and the security profile of
// sandbox/profile. Anything the sandbox allows beyond the record is a
// Deviation.
//
// The probe (sandbox/conformance/probe, subcommands reach, pidlimit and
// alloc) reports the environment's variable names, identity, capabilities,
// seccomp mode, namespaces, mounts, a walk of the filesystem (readable and
// writable paths, unix sockets), /dev, /proc/net/unix, interfaces, three
// outbound attempts (a TCP connection to a listener this process opens on
// the host's 127.0.0.1, one to the link-local metadata address, a DNS
// lookup of a public name), and the process and memory limits, each
// measured by exhausting it. The sandbox has no interface but loopback, so
// none of the attempts leaves it; never run the probe's reach outside a
// sandbox.
//
//	probe, err := guestbin.Probe()
//	r, err := blastradius.Run(ctx, eng, blastradius.Options{Tool: "code.execute", Probe: probe})
//	if err != nil { ... }            // the audit could not run
//	fmt.Print(r.Markdown())
//	if len(r.Deviations) > 0 { ... } // the sandbox is wider than the record
package blastradius

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/probeexec"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
	"github.com/stockade-sh/stockade/tools"
)

// Sandboxes is what the audit needs of the engine.
type Sandboxes interface {
	Tools() *tools.Set
	// Drivers are the drivers sessions come from, by name: what each
	// declares (its tier, whether it shares the host kernel) is what the
	// audit expects of its sandboxes.
	Drivers() map[string]sandbox.Driver
	NewSandbox(ctx context.Context, req engine.Request) (*engine.Sandbox, error)
}

var _ Sandboxes = (*engine.Engine)(nil)

// Options say which tool to audit and with which probe.
type Options struct {
	// Tool names the tool; empty means the default tool.
	Tool string
	// Runtime is the runtime image to probe from; empty means the first
	// runtime the tool allows among shell, python and node (the images
	// that can unpack the probe).
	Runtime string
	// Probe is the probe executable (static, uncompressed), e.g.
	// guestbin.Probe(). Required.
	Probe []byte

	// ExtraEnv is appended to the probe's environment and ExtraMounts to
	// the sandbox's mounts. They widen the sandbox beyond the record and
	// exist only so that tests can prove the audit notices; nothing
	// outside tests sets them. Nil means none.
	ExtraEnv    []string
	ExtraMounts []sandbox.Mount
}

// Report is the outcome of one audit. Everything in it that came from
// inside the sandbox was parsed strictly; environment values other than
// PATH's were never sent out of the sandbox.
type Report struct {
	Tool string `json:"tool"`
	// RecordFingerprint identifies the record audited (tools.Fingerprint).
	RecordFingerprint string       `json:"record_fingerprint"`
	Tier              sandbox.Tier `json:"tier"`
	Driver            string       `json:"driver"`
	Runtime           string       `json:"runtime"`
	Time              time.Time    `json:"time"`
	// RecordLimits are the record's effective limits, which the sandbox's
	// must equal.
	RecordLimits Limits `json:"record_limits"`
	// Sections hold the findings, in the order of the text report, each
	// with the checks made against the record.
	Sections []Section `json:"sections"`
	// Deviations are the failed checks of every section. Empty means the
	// sandbox is exactly as wide as the record says.
	Deviations []Check `json:"deviations"`
}

// Limits are limits in the report's units.
type Limits struct {
	MemoryBytes  int64   `json:"memory_bytes"`
	Pids         int64   `json:"pids"`
	CPU          float64 `json:"cpu"`
	TmpSizeBytes int64   `json:"tmp_size_bytes"`
	TimeoutMS    int64   `json:"timeout_ms"`
}

// Section is one area of findings ("environment", "mounts", ...).
type Section struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// Facts are what the probe found, one line each, for people.
	Facts []string `json:"facts"`
	// Table, when set, holds the findings as rows (the first row is the
	// header).
	Table [][]string `json:"table,omitempty"`
	// Checks compare the findings with the record.
	Checks []Check `json:"checks"`
}

// Check is one comparison of a finding with the record.
type Check struct {
	Section string `json:"section"`
	// Subject names what was compared: a variable, a mount point, a path.
	Subject  string `json:"subject"`
	Observed string `json:"observed"`
	Expected string `json:"expected"`
	// Deviation is true when the observation is outside the record.
	Deviation bool `json:"deviation"`
}

func (c Check) String() string {
	if c.Deviation {
		return fmt.Sprintf("%s: %s: %s (expected: %s)", c.Section, c.Subject, c.Observed, c.Expected)
	}
	return fmt.Sprintf("%s: %s: %s", c.Section, c.Subject, c.Observed)
}

// Run audits the tool opts names: it creates the tool's sandbox as an
// invocation would get it, runs the probe in it, destroys it, and returns
// the report. An error means the audit could not run (unknown tool, no
// runtime to probe from, sandbox failure); a sandbox wider than its record
// is a Report with Deviations.
func Run(ctx context.Context, eng Sandboxes, opts Options) (*Report, error) {
	if len(opts.Probe) == 0 {
		return nil, fmt.Errorf("blast radius: no probe given: %w", errdefs.ErrInvalidArgument)
	}
	tool, err := eng.Tools().Get(opts.Tool)
	if err != nil {
		return nil, err
	}
	runtime, err := pickRuntime(tool, opts.Runtime)
	if err != nil {
		return nil, err
	}
	u, ok := probeexec.UnpackerFor(runtime)
	if !ok {
		return nil, fmt.Errorf("no way to unpack the probe in the %s image: %w", runtime, errdefs.ErrInvalidArgument)
	}
	gz, err := probeexec.Compress(opts.Probe)
	if err != nil {
		return nil, err
	}
	req := engine.Request{
		Tool:        tool.Name,
		Runtime:     runtime,
		Limits:      auditLimits(tool.EffectiveLimits()),
		ExtraMounts: opts.ExtraMounts,
		Labels:      map[string]string{"stockade.audit": "blast-radius"},
	}
	// first is the first sandbox opened: what the tool, driver and runtime
	// were. Every sandbox of the audit is created from the same request.
	var first *engine.Sandbox
	open := func(ctx context.Context) (*engine.Sandbox, error) {
		sb, err := eng.NewSandbox(ctx, req)
		if err != nil {
			return nil, err
		}
		ictx, cancel := context.WithTimeout(ctx, installTimeout)
		defer cancel()
		if err := probeexec.Install(ictx, sb, gz, u); err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
			return nil, err
		}
		if first == nil {
			first = sb
		}
		return sb, nil
	}
	start := time.Now().UTC()
	env := append(engine.ProgramEnv(), opts.ExtraEnv...)
	o, err := collect(ctx, open, env, tool.EffectiveLimits())
	if err != nil {
		return nil, fmt.Errorf("blast radius of tool %q: %w", tool.Name, err)
	}
	drv, ok := eng.Drivers()[first.Driver]
	if !ok {
		return nil, fmt.Errorf("blast radius of tool %q: the session's driver %q is not among the engine's: %w", tool.Name, first.Driver, errdefs.ErrFailedPrecondition)
	}
	r := evaluate(profile.Default(), drv.Name(), drv.Capabilities(), first.Tool, o)
	r.Driver, r.Runtime, r.Time = first.Driver, first.Runtime.Name, start.Truncate(time.Second)
	return r, nil
}

// pickRuntime returns want, or the first runtime the tool allows whose
// image can unpack the probe.
func pickRuntime(t tools.Tool, want string) (string, error) {
	if want != "" {
		if _, ok := probeexec.UnpackerFor(want); !ok {
			return "", fmt.Errorf("runtime %q cannot unpack the probe (use one of %s): %w", want, strings.Join(probeexec.Runtimes(), ", "), errdefs.ErrInvalidArgument)
		}
		if !t.AllowsRuntime(want) {
			return "", fmt.Errorf("tool %q does not allow runtime %q (allowed: %s): %w", t.Name, want, strings.Join(t.Runtimes, ", "), errdefs.ErrInvalidArgument)
		}
		return want, nil
	}
	for _, r := range probeexec.Runtimes() {
		if t.AllowsRuntime(r) {
			return r, nil
		}
	}
	return "", fmt.Errorf("tool %q allows no runtime whose image can unpack the probe (%s): %w", t.Name, strings.Join(probeexec.Runtimes(), ", "), errdefs.ErrFailedPrecondition)
}

// deviations collects the failed checks of the sections, in order.
func deviations(ss []Section) []Check {
	out := []Check{}
	for _, s := range ss {
		for _, c := range s.Checks {
			if c.Deviation {
				out = append(out, c)
			}
		}
	}
	return out
}
