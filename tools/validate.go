package tools

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/dataroot"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/templates"
)

// Options are the host facts that validation checks records against. The
// daemon and `stockade tools lint` pass the same Options to the same code.
type Options struct {
	// DataRoot is the only directory under which mount sources may lie,
	// after symlinks are resolved. Empty means no mount is allowed.
	DataRoot string
	// Drivers are this host's drivers by name, with what each declares
	// (sandbox.Driver.Capabilities; see CapabilitiesOf): a record's tier
	// must be one of theirs, and the rules that depend on the tier
	// (untrusted input on a shared kernel, egress) read its facts from
	// them. Nil means no driver: every record is refused as
	// tier-unavailable.
	Drivers map[string]sandbox.Capabilities
	// Runtimes are the runtimes known to Stockade. Nil means image.Names().
	Runtimes []string
	// Ceiling bounds each tool's limits; zero means sandbox.DefaultCeiling().
	Ceiling sandbox.Limits
	// EgressSupported allows records with egress or credentials. False (the
	// zero value) refuses them as unsupported: a daemon that cannot give
	// egress (no root, no nftables) must not serve them. The
	// lethal-trifecta rule applies either way.
	EgressSupported bool
	// DefaultTier is the tier of the server's default driver, which the
	// built-in default tool runs on; empty means gvisor. See DefaultFor.
	DefaultTier sandbox.Tier
	// Templates are the templates a tool may name (Tool.Template). Nil
	// means none: every tool naming one is refused.
	Templates *templates.Set
}

// tiers returns the tiers of the drivers, in the order of sandbox.Tiers.
func (o Options) tiers() []sandbox.Tier {
	return slices.DeleteFunc(sandbox.Tiers(), func(t sandbox.Tier) bool {
		_, _, ok := DriverFor(o.Drivers, t)
		return !ok
	})
}

// caps returns the declared capabilities of the driver of tier t; false
// when no driver runs it.
func (o Options) caps(t sandbox.Tier) (sandbox.Capabilities, bool) {
	_, c, ok := DriverFor(o.Drivers, t)
	return c, ok
}

func (o Options) runtimes() []string {
	if o.Runtimes == nil {
		return image.Names()
	}
	return o.Runtimes
}

func (o Options) ceiling() sandbox.Limits {
	if o.Ceiling == (sandbox.Limits{}) {
		return sandbox.DefaultCeiling()
	}
	return o.Ceiling
}

// The rules, as they appear in Problem.Rule. They are stable: tests, docs
// and operators' tooling match on them.
const (
	RuleYAMLSyntax             = "yaml-syntax"
	RuleYAMLType               = "yaml-type"
	RuleUnknownField           = "unknown-field"
	RuleName                   = "name"
	RuleReservedName           = "reserved-name"
	RuleDuplicateName          = "duplicate-name"
	RuleCapability             = "unknown-capability"
	RuleRuntimes               = "runtimes"
	RuleInputTrust             = "input-trust"
	RuleTier                   = "tier"
	RuleTierUnavailable        = "tier-unavailable"
	RuleLimits                 = "limits"
	RuleScratch                = "scratch"
	RuleDataRoot               = "data-root"
	RuleMountSource            = "mount-source"
	RuleMountSocket            = "mount-socket"
	RuleMountCredentials       = "mount-credentials"
	RuleMountHome              = "mount-home"
	RuleMountSystem            = "mount-system"
	RuleMountOutsideDataRoot   = "mount-outside-data-root"
	RuleMountSymlinkEscape     = "mount-symlink-escape"
	RuleMountMissing           = "mount-source-missing"
	RuleMountTarget            = "mount-target"
	RuleMountTooLarge          = "mount-too-large"
	RuleEgress                 = "egress"
	RuleEgressUnsupported      = "egress-unsupported"
	RuleCredentials            = "credentials"
	RuleCredentialsUnsupported = "credentials-unsupported"
	RuleLethalTrifecta         = "lethal-trifecta"
	RuleUntrustedOnContainer   = "untrusted-on-container"
	RuleAcceptRisk             = "accept-risk"
	RuleTemplate               = "template"
	RuleTemplateRuntime        = "template-runtime"
	RuleTemplateFiles          = "template-files"
	RuleTemplateEnvSecret      = "template-env-secret"
)

// Problem is one reason a tool configuration is refused.
type Problem struct {
	// Source is "file" or "file:line" where known; empty otherwise.
	Source string
	// Tool is the tool's name; empty for problems of a file or of the
	// options rather than of one tool.
	Tool string
	// Rule is one of the Rule constants.
	Rule string
	// Message says what is wrong and, where it helps, how to fix it.
	Message string
}

// String renders the problem on one line:
//
//	tools.yaml:3: tool "sql-reader": rule untrusted-on-container: untrusted input ...
func (p Problem) String() string {
	var b strings.Builder
	if p.Source != "" {
		b.WriteString(p.Source + ": ")
	}
	if p.Tool != "" {
		fmt.Fprintf(&b, "tool %q: ", p.Tool)
	}
	fmt.Fprintf(&b, "rule %s: %s", p.Rule, p.Message)
	return b.String()
}

// Problems is every problem found in a configuration. As an error it reads
// one problem per line and is an ErrInvalidArgument.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

func (ps Problems) Unwrap() error { return errdefs.ErrInvalidArgument }

// Validate checks tools against every rule and returns all the problems
// found, in the order of the tools; none means the tools may be loaded. It
// reads nothing but mount sources and the data root (lstat and symlink
// resolution). Load calls it; so does `stockade tools lint`.
func Validate(ts []Tool, opts Options) Problems {
	var ps Problems
	root := checkDataRoot(ts, opts, &ps)
	seen := map[string]string{}
	for _, t := range ts {
		if t.Name != "" && t.Name != DefaultName {
			if first, dup := seen[t.Name]; dup {
				ps = append(ps, Problem{Source: t.Source, Tool: t.Name, Rule: RuleDuplicateName,
					Message: fmt.Sprintf("defined again (first at %s); tool names must be unique", first)})
			} else {
				seen[t.Name] = t.Source
			}
		}
		ps = append(ps, validateTool(t, opts, root)...)
	}
	return ps
}

var (
	// Names are at most 64 characters and labels 63; the lengths are
	// checked apart (see sandboxkit's idPattern).
	namePattern   = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`)
	opPattern     = regexp.MustCompile(`^[a-z][a-z0-9]*([._-][a-z0-9]+)*$`)
	labelPattern  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
	digitsPattern = regexp.MustCompile(`^[0-9]+$`)
)

func validateTool(t Tool, opts Options, root dataroot.Root) Problems {
	var ps Problems
	add := func(rule, format string, a ...any) {
		ps = append(ps, Problem{Source: t.Source, Tool: t.Name, Rule: rule, Message: fmt.Sprintf(format, a...)})
	}

	switch {
	case t.Name == "":
		add(RuleName, "name is required")
	case t.Name == DefaultName:
		add(RuleReservedName, "%s is the built-in default tool (untrusted, gvisor, no mounts, no egress, no credentials) and cannot be redefined; give this tool another name", DefaultName)
	case len(t.Name) > 64 || !namePattern.MatchString(t.Name):
		add(RuleName, "name must be 1-64 lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or digit")
	}

	if t.Capability != "" && t.Capability != CapabilityCodeExecute {
		add(RuleCapability, "unknown capability %q (known: %s)", t.Capability, CapabilityCodeExecute)
	}

	known := opts.runtimes()
	for i, rt := range t.Runtimes {
		switch {
		case !slices.Contains(known, rt):
			add(RuleRuntimes, "unknown runtime %q (known: %s)", rt, strings.Join(known, ", "))
		case slices.Index(t.Runtimes, rt) != i:
			add(RuleRuntimes, "runtime %q is listed twice", rt)
		}
	}

	switch t.InputTrust {
	case Untrusted, Trusted:
	case "":
		add(RuleInputTrust, "input_trust is required: untrusted (web, mail, retrieval or user input can influence the code) or trusted")
	default:
		add(RuleInputTrust, "unknown input_trust %q (known: untrusted, trusted)", t.InputTrust)
	}

	switch known := sandbox.Tiers(); {
	case t.Tier == "":
		add(RuleTier, "tier is required: %s", joinOr(known))
	case !slices.Contains(known, t.Tier):
		add(RuleTier, "unknown tier %q (known: %s)", t.Tier, joinTiers(known))
	default:
		if _, ok := opts.caps(t.Tier); !ok {
			add(RuleTierUnavailable, "tier %s is not available on this host (available: %s)", t.Tier, orNone(joinTiers(opts.tiers())))
		}
	}

	if err := t.Limits.Check(opts.ceiling()); err != nil {
		add(RuleLimits, "%s", strings.TrimSuffix(err.Error(), ": "+errdefs.ErrInvalidArgument.Error()))
	}

	switch t.Filesystem.ScratchLifetime {
	case "", LifetimeInvocation, LifetimeSession:
	default:
		add(RuleScratch, "unknown scratch lifetime %q (known: invocation, session)", t.Filesystem.ScratchLifetime)
	}

	targets := map[string]bool{}
	for i, m := range t.Filesystem.Mounts {
		resolved, mps := checkMount(m, root)
		if resolved != "" {
			if p := checkTree(resolved, m.Source); p != nil {
				mps = append(mps, *p)
			}
		}
		if targets[filepath.Clean(m.Target)] {
			mps = append(mps, Problem{Rule: RuleMountTarget, Message: fmt.Sprintf("mount target %s is used twice", m.Target)})
		}
		targets[filepath.Clean(m.Target)] = true
		for _, p := range mps {
			p.Source, p.Tool = t.mountSource(i), t.Name
			ps = append(ps, p)
		}
	}

	ps = append(ps, validateEgress(t, opts)...)
	ps = append(ps, validateTemplate(t, opts)...)

	// The rules a record can only break as a whole. An incomplete
	// accept_risk overrides nothing.
	if t.AcceptRisk != nil {
		var missing []string
		if strings.TrimSpace(t.AcceptRisk.By) == "" {
			missing = append(missing, "by")
		}
		if strings.TrimSpace(t.AcceptRisk.Reason) == "" {
			missing = append(missing, "reason")
		}
		if len(missing) > 0 {
			verb := "is"
			if len(missing) > 1 {
				verb = "are"
			}
			add(RuleAcceptRisk, "accept_risk needs both by (who accepts the risk) and reason (why); %s %s missing", strings.Join(missing, " and "), verb)
		}
	}
	accepted := riskAccepted(t)
	if trifecta(t) && !accepted {
		add(RuleLethalTrifecta, "untrusted input, egress (%s) and reachable credentials (%s) together are the lethal trifecta; remove the egress or the credentials, or record accept_risk {by, reason}",
			strings.Join(t.Egress.Allow, ", "), strings.Join(t.Credentials, ", "))
	}
	if untrustedOnSharedKernel(t, opts) && !accepted {
		add(RuleUntrustedOnContainer, "untrusted input on the %s tier needs accept_risk {by, reason}; use tier gvisor, or record who accepts the shared-kernel risk and why", t.Tier)
	}
	return ps
}

func validateEgress(t Tool, opts Options) Problems {
	var ps Problems
	add := func(rule, format string, a ...any) {
		ps = append(ps, Problem{Source: t.Source, Tool: t.Name, Rule: rule, Message: fmt.Sprintf(format, a...)})
	}
	e := t.Egress
	c, ok := opts.caps(t.Tier)
	// A remote driver's provider enforces the allowlist itself
	// (sandbox.NetworkAllowlist); the broker it cannot reach.
	provider := ok && !slices.Contains(c.NetworkModes, sandbox.NetworkEgress) && slices.Contains(c.NetworkModes, sandbox.NetworkAllowlist)
	if provider && len(t.Credentials) > 0 {
		add(RuleCredentials, "the %s tier's sandboxes run on a provider's machines, out of the credential broker's reach; use credentials: none", t.Tier)
	}
	if ok && !provider && !slices.Contains(c.NetworkModes, sandbox.NetworkEgress) && (!e.None() || len(t.Credentials) > 0) {
		// The tier's driver has no network mode but none: every run of
		// such a tool would fail.
		var with []sandbox.Tier
		for _, tier := range opts.tiers() {
			if c, _ := opts.caps(tier); slices.Contains(c.NetworkModes, sandbox.NetworkEgress) {
				with = append(with, tier)
			}
		}
		if len(with) == 0 {
			add(RuleEgress, "the %s tier gives a sandbox no network at all, so neither egress nor credentials, and no driver of this host gives egress; use egress: none", t.Tier)
		} else {
			add(RuleEgress, "the %s tier gives a sandbox no network at all, so neither egress nor credentials; use tier %s", t.Tier, joinOr(with))
		}
	}
	if !e.None() {
		if !opts.EgressSupported {
			add(RuleEgressUnsupported, "egress is not supported on this host (the daemon runs without egress: it needs root and nftables); use egress: none")
		}
		if len(e.Allow) == 0 {
			add(RuleEgress, "egress lists ports but no domains; list domains in allow, or write egress: none")
		}
		if len(e.Ports) == 0 {
			add(RuleEgress, "egress lists domains but no ports; list them in ports, e.g. [443]")
		}
	}
	for i, d := range e.Allow {
		if msg := checkDomain(d); msg != "" {
			add(RuleEgress, "%s", msg)
		} else if slices.Index(e.Allow, d) != i {
			add(RuleEgress, "domain %q is listed twice", d)
		}
	}
	for i, p := range e.Ports {
		if p < 1 || p > 65535 {
			add(RuleEgress, "port %d is out of range 1-65535", p)
		} else if p == 53 {
			add(RuleEgress, "port 53 is the sandbox's DNS, which Stockade answers with the allowlist itself; list only the ports of the services")
		} else if slices.Index(e.Ports, p) != i {
			add(RuleEgress, "port %d is listed twice", p)
		}
	}
	if len(t.Credentials) > 0 && !opts.EgressSupported {
		add(RuleCredentialsUnsupported, "credentials are not supported on this host (the daemon runs without egress: it needs root and nftables); use credentials: none")
	}
	for i, op := range t.Credentials {
		switch {
		case len(op) > 64 || !opPattern.MatchString(op):
			add(RuleCredentials, "broker operation %q is not a valid name (lower-case letters and digits separated by '.', '_' or '-')", op)
		case slices.Index(t.Credentials, op) != i:
			add(RuleCredentials, "broker operation %q is listed twice", op)
		}
	}
	return ps
}

// checkDomain returns why d is not a valid allowlist entry, or "".
func checkDomain(d string) string {
	name, wild := strings.CutPrefix(d, "*.")
	labels := strings.Split(name, ".")
	switch {
	case d == "*" || d == "*.*":
		return fmt.Sprintf("domain %q would open egress to the whole internet; list the domains the tool needs", d)
	case len(d) > 253:
		return fmt.Sprintf("domain %q is longer than 253 characters", d)
	case strings.ContainsAny(name, "*"):
		return fmt.Sprintf("domain %q: a wildcard is only allowed as a leading \"*.\"", d)
	case strings.ContainsAny(d, ":/[]") || digitsPattern.MatchString(labels[len(labels)-1]):
		return fmt.Sprintf("domain %q: egress allows domain names only, not IP addresses, ports or URLs", d)
	case len(labels) < 2:
		if wild {
			return fmt.Sprintf("domain %q: a wildcard must cover a registered domain (e.g. *.example.com), not a whole top-level domain", d)
		}
		return fmt.Sprintf("domain %q is not a fully qualified domain name", d)
	}
	for _, l := range labels {
		if len(l) > 63 || !labelPattern.MatchString(l) {
			return fmt.Sprintf("domain %q is not a valid lower-case domain name", d)
		}
	}
	if wild && egress.IsPublicSuffix(name) {
		return fmt.Sprintf("domain %q: a wildcard must cover a registered domain (e.g. *.example.co.uk), not the public suffix %s, below which anyone can register names", d, name)
	}
	return ""
}

// trifecta reports whether the record combines untrusted input, egress and
// credentials.
func trifecta(t Tool) bool {
	return t.InputTrust == Untrusted && !t.Egress.None() && len(t.Credentials) > 0
}

// untrustedOnSharedKernel reports whether untrusted code would run on a tier
// whose driver declares that it shares the host kernel.
func untrustedOnSharedKernel(t Tool, opts Options) bool {
	c, ok := opts.caps(t.Tier)
	return t.InputTrust == Untrusted && ok && c.SharedKernel
}

// riskAccepted reports whether the record carries a complete accept_risk.
func riskAccepted(t Tool) bool {
	return t.AcceptRisk != nil && strings.TrimSpace(t.AcceptRisk.By) != "" && strings.TrimSpace(t.AcceptRisk.Reason) != ""
}

// overrides lists the rules the record's accept_risk overrides.
func overrides(t Tool, opts Options) []string {
	var rs []string
	if trifecta(t) {
		rs = append(rs, RuleLethalTrifecta)
	}
	if untrustedOnSharedKernel(t, opts) {
		rs = append(rs, RuleUntrustedOnContainer)
	}
	return rs
}

func joinTiers(ts []sandbox.Tier) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}

// joinOr joins tiers as "a", "a or b", "a, b or c".
func joinOr(ts []sandbox.Tier) string {
	if len(ts) < 2 {
		return joinTiers(ts)
	}
	return joinTiers(ts[:len(ts)-1]) + " or " + string(ts[len(ts)-1])
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
