// Package tools holds Stockade's code-executing tools and their isolation
// records (docs/design.md §8): who may influence a tool's code (input
// trust), the tier it runs on, the host data it can read, where it may
// connect and which broker operations it may call. Tools are configuration,
// loaded from a YAML file or a directory of *.yaml files; the built-in
// default tool "code.execute" exists without any file. A tool may name a
// template (package templates) whose image its sandboxes run; its record
// then carries the template's declaration (Options.Templates, LintTemplate).
//
// The package is pure except for reading the configuration and looking at
// mount sources (lstat and symlink resolution). It decides nothing at run
// time: the engine enforces a record by choosing the driver of its tier
// (DriverFor), binding the mounts ResolveMounts returns read-only, and
// applying EffectiveLimits. What a tier is (whether it shares the host
// kernel, whether it can give egress, its boundary) it reads from the
// drivers' declared capabilities (Options.Drivers), never from its name.
//
//	set, err := tools.Load("/etc/stockade/tools.d", tools.Options{DataRoot: "/var/lib/stockade/data"})
//	if err != nil {
//		// A tools.Problems lists every problem, one per line.
//	}
//	t, err := set.Get(req.Tool) // "" is the default tool
//	fmt.Print(tools.Record(t))
package tools

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/templates"
)

// DefaultName is the name of the built-in default tool. An invocation that
// names no tool runs as this tool, and no configuration may redefine it.
const DefaultName = "code.execute"

// CapabilityCodeExecute is the only capability a tool can grant today.
const CapabilityCodeExecute = "code.execute"

// Trust says who can influence the code a tool runs.
type Trust string

const (
	// Untrusted: web browsing, mail, retrieval or user input can influence
	// the code. Assume the code is written by an attacker.
	Untrusted Trust = "untrusted"
	// Trusted: the operator controls every input end to end.
	Trusted Trust = "trusted"
)

// Lifetime says how long a tool's writable scratch (the /tmp tmpfs) lives.
type Lifetime string

// The lifetimes of a tool's scratch.
const (
	// LifetimeInvocation: the scratch is destroyed with the sandbox after
	// each invocation. It is the zero value's meaning.
	LifetimeInvocation Lifetime = "invocation"
	// LifetimeSession: the tool is meant for sessions, whose /tmp and
	// /workspace live as long as the session (across its cells) and are
	// destroyed with its sandbox when it ends; its one-shot invocations'
	// scratch still dies with each of them.
	LifetimeSession Lifetime = "session"
)

// Tool is one code-executing tool and its isolation record. Values come from
// Load (validated) or Default; a Tool built by hand must pass Validate before
// anything runs as it.
type Tool struct {
	// Name identifies the tool in invocations (the "tool" field).
	Name string
	// Capability is the capability the tool grants; empty means
	// CapabilityCodeExecute.
	Capability string
	// Runtimes are the runtimes the tool allows ("python", "node",
	// "shell"). Nil or empty means every runtime Stockade ships.
	Runtimes []string
	// Limits bound each sandbox of the tool. Zero fields take the defaults
	// (see EffectiveLimits), never "unlimited". Limits.TmpSize is the size of
	// the writable scratch.
	Limits sandbox.Limits

	// The record's five lines.

	// InputTrust is required: the zero value is refused by Validate.
	InputTrust Trust
	// Tier picks the driver (see DriverFor). Required.
	Tier sandbox.Tier
	// Filesystem is the host data the tool reads and its scratch.
	Filesystem Filesystem
	// Egress is where the tool's code may connect. The zero value is none:
	// no interface but loopback.
	Egress Egress
	// Credentials are the credential broker operations the tool's code may
	// call. Nil or empty means none.
	Credentials []string

	// AcceptRisk, when set with both By and Reason, overrides the rules that
	// refuse untrusted input on a shared-kernel tier and the lethal trifecta.
	// Nil means no risk is accepted.
	AcceptRisk *AcceptRisk

	// Template names the template (package templates) whose image the
	// tool's sandboxes run instead of the bare runtime's; empty means
	// none. The record carries the template's declaration (see
	// TemplateDeclaration), so that a change of the declaration is a
	// change of the record.
	Template string

	// Source is where the tool was defined ("tools.yaml:12", or "built-in").
	// It is not part of the record.
	Source string
	// template is the declaration of Template that Load bound the tool
	// to (Options.Templates); nil when the tool has no template or was
	// built by hand.
	template *templates.Template
	// mountAt is where each mount was defined, when Parse knows; problems
	// with a mount name its line rather than the tool's.
	mountAt []string
}

// clone returns t with its own copies of every slice, so that a caller
// cannot change a Set through a Tool it got from it.
func (t Tool) clone() Tool {
	t.Runtimes = slices.Clone(t.Runtimes)
	t.Filesystem.Mounts = slices.Clone(t.Filesystem.Mounts)
	t.Egress.Allow = slices.Clone(t.Egress.Allow)
	t.Egress.Ports = slices.Clone(t.Egress.Ports)
	t.Credentials = slices.Clone(t.Credentials)
	t.mountAt = slices.Clone(t.mountAt)
	if t.template != nil {
		d := t.template.Clone()
		t.template = &d
	}
	if t.AcceptRisk != nil {
		r := *t.AcceptRisk
		t.AcceptRisk = &r
	}
	return t
}

// TemplateDeclaration returns the declaration of the tool's template as
// Load bound it; false when the tool has no template, or was built by hand
// and not bound (see BindTemplate).
func (t Tool) TemplateDeclaration() (templates.Template, bool) {
	if t.template == nil {
		return templates.Template{}, false
	}
	return t.template.Clone(), true
}

// BindTemplate returns t bound to tmpl, the declaration of the template
// it names, as Load binds the tools it loads: the record then carries
// the declaration. Validate still checks the binding against
// Options.Templates.
func BindTemplate(t Tool, tmpl templates.Template) Tool {
	t = t.clone()
	d := tmpl.Clone()
	t.Template, t.template = tmpl.Name, &d
	return t
}

// mountSource returns where the i-th mount was defined, or the tool's Source.
func (t Tool) mountSource(i int) string {
	if i < len(t.mountAt) {
		return t.mountAt[i]
	}
	return t.Source
}

// Filesystem is the filesystem line of a record. The root filesystem is
// always read-only.
type Filesystem struct {
	// Mounts are host paths bound read-only into the sandbox, each under the
	// data root. Nil means no host data at all.
	Mounts []sandbox.Mount
	// ScratchLifetime is how long the writable /tmp tmpfs lives; its size is
	// the tool's Limits.TmpSize. Zero means LifetimeInvocation.
	ScratchLifetime Lifetime
}

// Egress is the egress line of a record. The zero value is "none".
type Egress struct {
	// Allow are the domain names the code may reach through the egress
	// proxy; "*.example.com" matches every name below example.com (not
	// example.com itself). Nil means none.
	Allow []string
	// Ports are the destination ports allowed for those names.
	Ports []int
}

// None reports whether the egress line is "none".
func (e Egress) None() bool { return len(e.Allow) == 0 && len(e.Ports) == 0 }

// AcceptRisk records that a named person accepted a risk the rules would
// otherwise refuse, and why.
type AcceptRisk struct {
	By     string
	Reason string
}

// Default returns the built-in default tool: untrusted input, gVisor, no
// mounts, no egress, no credentials, every runtime, default limits.
func Default() Tool {
	return Tool{
		Name:       DefaultName,
		Capability: CapabilityCodeExecute,
		InputTrust: Untrusted,
		Tier:       sandbox.TierGVisor,
		Source:     "built-in",
	}
}

// DefaultFor returns the default tool as a server whose default driver runs
// tier serves it. On any tier but gVisor the record carries the operator's
// accepted risk, so that the record says what actually runs untrusted code.
func DefaultFor(tier sandbox.Tier) Tool {
	t := Default()
	if tier != "" && tier != t.Tier {
		t.Tier = tier
		t.AcceptRisk = &AcceptRisk{
			By:     "server configuration (default driver)",
			Reason: fmt.Sprintf("the operator made the %s tier the server's default", tier),
		}
	}
	return t
}

// DriverFor returns the name of the driver among drivers (by name, with
// their declared capabilities) that runs tier t, and its capabilities;
// false when none does. Of several, the first by name is chosen, so that
// the choice is stable.
func DriverFor(drivers map[string]sandbox.Capabilities, t sandbox.Tier) (string, sandbox.Capabilities, bool) {
	for _, name := range slices.Sorted(maps.Keys(drivers)) {
		if c := drivers[name]; c.Tier == t {
			return name, c, true
		}
	}
	return "", sandbox.Capabilities{}, false
}

// CapabilitiesOf returns what each of drivers declares, by name: the
// Options.Drivers of an engine's drivers.
func CapabilitiesOf(drivers map[string]sandbox.Driver) map[string]sandbox.Capabilities {
	out := make(map[string]sandbox.Capabilities, len(drivers))
	for name, d := range drivers {
		out[name] = d.Capabilities()
	}
	return out
}

// DefaultCPU is the CPU default of a tier (docs/design.md §3): half a core
// where the kernel is shared, one core for gVisor and microVMs. It restates
// what each driver declares (sandbox.Capabilities.DefaultCPU), which a test
// holds it to, because EffectiveLimits and so a record's Fingerprint take it
// without a driver at hand.
func DefaultCPU(t sandbox.Tier) float64 {
	switch t {
	case sandbox.TierContainer, sandbox.TierDocker:
		return 0.5
	}
	return 1
}

// EffectiveLimits returns the tool's limits with every zero field taken from
// sandbox.DefaultLimits and the tier's CPU default. An engine configured with
// other defaults applies them instead: t.Limits.WithDefaults(defaults), then
// DefaultCPU(t.Tier) if CPU is still zero.
func (t Tool) EffectiveLimits() sandbox.Limits {
	l := t.Limits.WithDefaults(sandbox.DefaultLimits())
	if l.CPU == 0 {
		l.CPU = DefaultCPU(t.Tier)
	}
	return l
}

// AllowsRuntime reports whether code in the runtime may run as the tool.
func (t Tool) AllowsRuntime(runtime string) bool {
	return len(t.Runtimes) == 0 || slices.Contains(t.Runtimes, runtime)
}

// Set is a validated set of tools, always including the default tool. The
// nil *Set holds the default tool only. A Set is immutable and safe for
// concurrent use.
type Set struct {
	byName map[string]Tool
	def    Tool
	// templates are the templates the tools were loaded with.
	templates *templates.Set
}

func newSet(ts []Tool, def Tool) *Set {
	s := &Set{byName: map[string]Tool{DefaultName: def}, def: def}
	for _, t := range ts {
		s.byName[t.Name] = t
	}
	return s
}

// Get returns the tool called name; the empty name is the default tool. An
// unknown name is an ErrNotFound.
func (s *Set) Get(name string) (Tool, error) {
	if name == "" || name == DefaultName {
		if s != nil {
			return s.def.clone(), nil
		}
		return Default(), nil
	}
	if s != nil {
		if t, ok := s.byName[name]; ok {
			return t.clone(), nil
		}
	}
	return Tool{}, errdefs.Publicf("unknown tool %q (known: %s): %w", name, strings.Join(s.Names(), ", "), errdefs.ErrNotFound)
}

// Names returns the names of the tools, the default tool first, then sorted.
func (s *Set) Names() []string {
	names := []string{DefaultName}
	if s != nil {
		rest := slices.Collect(maps.Keys(s.byName))
		sort.Strings(rest)
		for _, n := range rest {
			if n != DefaultName {
				names = append(names, n)
			}
		}
	}
	return names
}

// Tools returns the tools in the order of Names.
func (s *Set) Tools() []Tool {
	var ts []Tool
	for _, n := range s.Names() {
		t, _ := s.Get(n)
		ts = append(ts, t)
	}
	return ts
}

// Templates returns the templates the tools were loaded with
// (Options.Templates), so that whoever serves the tools serves the very
// declarations their records carry; nil when none were.
func (s *Set) Templates() *templates.Set {
	if s == nil {
		return nil
	}
	return s.templates
}

// Len is the number of tools, the default tool included.
func (s *Set) Len() int { return len(s.Names()) }
