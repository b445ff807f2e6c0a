package tools

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/templates"
)

// Record renders the tool's decision record as Markdown: the five lines, the
// tier's boundary as its driver among opts.Drivers declares it, the
// effective limits, any accepted risk with who accepted it and why, and the
// record's Fingerprint.
func Record(t Tool, opts Options) string {
	c := canonical(t)
	var b strings.Builder
	fmt.Fprintf(&b, "# Tool `%s`\n\n", c.Name)
	where := "Defined in " + orUnknown(t.Source) + "."
	if t.Source == Default().Source {
		where = "Built in: no configuration defines it, and none may redefine it."
	}
	fmt.Fprintf(&b, "Capability `%s`, runtimes: %s. %s\n\n", c.Capability, runtimesLine(c.Runtimes), where)

	b.WriteString("## Record\n\n")
	for _, l := range RecordLines(t, opts) {
		fmt.Fprintf(&b, "- **%s:** %s\n", l.Label, l.Value)
	}

	if c.Template != nil {
		b.WriteString("\n## Template\n\n")
		b.WriteString(templateLine(c) + "\n")
	}

	b.WriteString("\n## Boundary\n\n")
	fmt.Fprintf(&b, "%s: %s.\n", c.Tier, Boundary(t, opts))

	l := t.EffectiveLimits()
	b.WriteString("\n## Effective limits\n\n")
	b.WriteString("| limit | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| wall clock | %s per execution |\n", sandbox.FormatDuration(l.Timeout))
	fmt.Fprintf(&b, "| memory | %s, no swap |\n", sandbox.FormatSize(l.Memory))
	fmt.Fprintf(&b, "| cpu | %s vCPU |\n", strconv.FormatFloat(l.CPU, 'g', -1, 64))
	fmt.Fprintf(&b, "| processes | %d |\n", l.Pids)
	fmt.Fprintf(&b, "| scratch (/tmp) | %s |\n", sandbox.FormatSize(l.TmpSize))
	fmt.Fprintf(&b, "| output | %s each of stdout and stderr |\n", sandbox.FormatSize(l.OutputCap))

	b.WriteString("\n## Accepted risk\n\n")
	switch {
	case t.AcceptRisk == nil:
		b.WriteString("None.\n")
	default:
		fmt.Fprintf(&b, "Accepted by %s.\n\nReason: %s\n\n", orUnknown(strings.TrimSpace(t.AcceptRisk.By)), orUnknown(strings.TrimSpace(t.AcceptRisk.Reason)))
		if rs := overrides(t, opts); len(rs) > 0 {
			fmt.Fprintf(&b, "Overrides: %s.\n", strings.Join(rs, ", "))
		} else {
			b.WriteString("Overrides: nothing; this record needs no accepted risk.\n")
		}
	}
	fmt.Fprintf(&b, "\n---\n\nRecord fingerprint: `%s`\n", Fingerprint(t))
	return b.String()
}

// RecordLine is one of the five lines of a tool's decision record.
type RecordLine struct {
	Label string // "Input trust", "Runtime tier", ...
	// Value is the line as Record renders it: names, paths and hosts are
	// quoted in Markdown backticks.
	Value string
}

// RecordLines returns the five lines of the tool's decision record, in
// order: input trust, runtime tier, filesystem scope, egress allowlist,
// credentials reachable.
func RecordLines(t Tool, opts Options) []RecordLine {
	c := canonical(t)
	driver, _, runs := DriverFor(opts.Drivers, t.Tier)
	return []RecordLine{
		{"Input trust", trustLine(t.InputTrust)},
		{"Runtime tier", tierLine(t.Tier, driver, runs)},
		{"Filesystem scope", filesystemLine(c)},
		{"Egress allowlist", egressLine(c)},
		{"Credentials reachable", credentialsLine(c)},
	}
}

// Boundary says what separates the code of t from the host, as the driver
// of its tier among opts.Drivers declares it.
func Boundary(t Tool, opts Options) string {
	if _, caps, runs := DriverFor(opts.Drivers, t.Tier); runs {
		return caps.Boundary
	}
	return "no driver of this host runs the tier"
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

func runtimesLine(rs []string) string {
	if len(rs) == 0 {
		return "all"
	}
	return strings.Join(rs, ", ")
}

func trustLine(t Trust) string {
	switch t {
	case Untrusted:
		return "untrusted (web, mail, retrieval or user input can influence the code: treat it as attacker-written)"
	case Trusted:
		return "trusted (the operator controls every input end to end)"
	}
	return orUnknown(string(t))
}

func tierLine(t sandbox.Tier, driver string, runs bool) string {
	if runs {
		return fmt.Sprintf("%s (driver `%s`)", t, driver)
	}
	return orUnknown(string(t))
}

func filesystemLine(c canonicalRecord) string {
	var parts []string
	if len(c.Filesystem.Mounts) == 0 {
		parts = append(parts, "no host data")
	}
	for _, m := range c.Filesystem.Mounts {
		parts = append(parts, fmt.Sprintf("`%s` read-only at `%s`", m.Source, m.Target))
	}
	if c.decl != nil {
		for _, f := range c.decl.Files {
			parts = append(parts, fmt.Sprintf("`%s` copied read-only into the image at `%s` (template `%s`)", f.Source, f.Target, c.decl.Name))
		}
	}
	if c.Filesystem.ScratchLifetime == LifetimeSession {
		parts = append(parts, fmt.Sprintf("writable scratch `/tmp` %s, and a session's `/workspace`, kept across a session's cells and destroyed with its sandbox when the session ends (a one-shot invocation's after it)", sandbox.FormatSize(c.Filesystem.ScratchBytes)))
	} else {
		parts = append(parts, fmt.Sprintf("writable scratch `/tmp` %s, destroyed with the sandbox after each invocation", sandbox.FormatSize(c.Filesystem.ScratchBytes)))
	}
	parts = append(parts, "root filesystem read-only")
	return strings.Join(parts, "; ")
}

func egressLine(c canonicalRecord) string {
	if len(c.Egress.Allow) == 0 && len(c.Egress.Ports) == 0 {
		return "none (no network interface but loopback)"
	}
	ports := make([]string, len(c.Egress.Ports))
	for i, p := range c.Egress.Ports {
		ports[i] = strconv.Itoa(p)
	}
	noun := "ports"
	if len(ports) == 1 {
		noun = "port"
	}
	return fmt.Sprintf("%s on %s %s, through the egress proxy", strings.Join(quoteAll(c.Egress.Allow), ", "), noun, strings.Join(ports, ", "))
}

func credentialsLine(c canonicalRecord) string {
	if len(c.Credentials) == 0 {
		return "none (no secret in the sandbox, no broker operation)"
	}
	return fmt.Sprintf("broker operations %s (secrets stay in the broker)", strings.Join(quoteAll(c.Credentials), ", "))
}

func quoteAll(ss []string) []string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = "`" + s + "`"
	}
	return q
}

// canonicalRecord is the record in a form where equal records are equal
// values: defaults applied, lists sorted. Its JSON is what Fingerprint hashes,
// so its field names and order are part of the fingerprint's stability.
type canonicalRecord struct {
	Name        string              `json:"name"`
	Capability  string              `json:"capability"`
	Runtimes    []string            `json:"runtimes"` // empty: all
	InputTrust  Trust               `json:"input_trust"`
	Tier        sandbox.Tier        `json:"tier"`
	Filesystem  canonicalFilesystem `json:"filesystem"`
	Egress      canonicalEgress     `json:"egress"`
	Credentials []string            `json:"credentials"`
	Limits      canonicalLimits     `json:"limits"`
	AcceptRisk  *AcceptRisk         `json:"accept_risk"`
	// Template is absent when the tool names none, so that the records
	// (and fingerprints) of tools without one are what they were before
	// templates existed.
	Template *canonicalTemplateRef `json:"template,omitempty"`

	// decl is Template's declaration decoded, in its canonical form;
	// nil when there is none.
	decl *templates.Template
}

// canonicalTemplateRef is the template of a record: its name and its
// declaration (templates.Canonical), so that a change of the declaration is
// a change of every record naming it.
type canonicalTemplateRef struct {
	Name        string          `json:"name"`
	Declaration json.RawMessage `json:"declaration,omitempty"`
}

// bindDecl decodes the declaration of c's template into c.decl.
func (c *canonicalRecord) bindDecl() error {
	if c.Template == nil || len(c.Template.Declaration) == 0 {
		return nil
	}
	d, err := templates.FromCanonical(c.Template.Declaration)
	if err != nil {
		return err
	}
	c.decl = &d
	return nil
}

type canonicalFilesystem struct {
	Mounts          []canonicalMount `json:"mounts"`
	ScratchBytes    int64            `json:"scratch_bytes"`
	ScratchLifetime Lifetime         `json:"scratch_lifetime"`
}

type canonicalMount struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

type canonicalEgress struct {
	Allow []string `json:"allow"`
	Ports []int    `json:"ports"`
}

// canonicalLimits leaves out TmpSize: it is the filesystem's ScratchBytes.
type canonicalLimits struct {
	MemoryBytes    int64   `json:"memory_bytes"`
	CPU            float64 `json:"cpu"`
	Pids           int64   `json:"pids"`
	TimeoutMS      int64   `json:"timeout_ms"`
	OutputCapBytes int64   `json:"output_cap_bytes"`
}

func canonical(t Tool) canonicalRecord {
	// Empty lists are [] (never null) so that nil and empty agree.
	sorted := func(s []string) []string {
		s = append([]string{}, s...)
		sort.Strings(s)
		return slices.Compact(s)
	}
	l := t.EffectiveLimits()
	c := canonicalRecord{
		Name:        t.Name,
		Capability:  t.Capability,
		Runtimes:    sorted(t.Runtimes),
		InputTrust:  t.InputTrust,
		Tier:        t.Tier,
		Credentials: sorted(t.Credentials),
		Egress:      canonicalEgress{Allow: sorted(t.Egress.Allow), Ports: sortedInts(t.Egress.Ports)},
		Limits: canonicalLimits{
			MemoryBytes:    l.Memory,
			CPU:            l.CPU,
			Pids:           l.Pids,
			TimeoutMS:      l.Timeout.Milliseconds(),
			OutputCapBytes: l.OutputCap,
		},
		Filesystem: canonicalFilesystem{
			ScratchBytes:    l.TmpSize,
			ScratchLifetime: t.Filesystem.ScratchLifetime,
			Mounts:          []canonicalMount{},
		},
	}
	if c.Capability == "" {
		c.Capability = CapabilityCodeExecute
	}
	if c.Filesystem.ScratchLifetime == "" {
		c.Filesystem.ScratchLifetime = LifetimeInvocation
	}
	for _, m := range t.Filesystem.Mounts {
		c.Filesystem.Mounts = append(c.Filesystem.Mounts, canonicalMount{Source: m.Source, Target: m.Target})
	}
	sort.Slice(c.Filesystem.Mounts, func(i, j int) bool { return c.Filesystem.Mounts[i].Target < c.Filesystem.Mounts[j].Target })
	if t.AcceptRisk != nil {
		c.AcceptRisk = &AcceptRisk{By: strings.TrimSpace(t.AcceptRisk.By), Reason: strings.TrimSpace(t.AcceptRisk.Reason)}
	}
	if t.Template != "" {
		c.Template = &canonicalTemplateRef{Name: t.Template}
		if t.template != nil {
			c.Template.Declaration = templates.Canonical(*t.template)
			_ = c.bindDecl() // its own canonical form: cannot fail
		}
	}
	return c
}

func sortedInts(s []int) []int {
	s = append([]int{}, s...)
	slices.Sort(s)
	return slices.Compact(s)
}

// Canonical returns the record as canonical JSON: defaults applied, lists
// sorted, keys in a fixed order. Two tools with equal records have equal
// Canonical bytes; Source is not part of it. Audit events carry it.
func Canonical(t Tool) []byte {
	b, err := json.Marshal(canonical(t))
	if err != nil {
		panic(fmt.Sprintf("tools: marshalling a canonical record: %v", err)) // plain data: cannot fail
	}
	return b
}

// Fingerprint is "sha256:" and the hex SHA-256 of Canonical(t). The daemon
// compares fingerprints between loads to find changed records.
func Fingerprint(t Tool) string {
	sum := sha256.Sum256(Canonical(t))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// templateLine renders the template of a record for Record: what it adds
// to its base and the declaration's key.
func templateLine(c canonicalRecord) string {
	d := c.decl
	if d == nil {
		return fmt.Sprintf("`%s` (its declaration is not known here).", c.Template.Name)
	}
	code := func(s, what string) string {
		if s == "" {
			return "no " + what
		}
		return fmt.Sprintf("%s of %d bytes", what, len(s))
	}
	ready := "no ready check"
	if d.Ready != "" {
		ready = fmt.Sprintf("a ready check of %d bytes", len(d.Ready))
	}
	workdir := "the runtime's"
	if d.Workdir != "" {
		workdir = "`" + d.Workdir + "`"
	}
	golden := "starts cold"
	if d.Golden {
		golden = "restores a golden checkpoint where the tier can save one"
	}
	wheels := make([]string, len(d.PythonWheels))
	for i, w := range d.PythonWheels {
		wheels[i] = w.String()
	}
	return fmt.Sprintf("`%s`, on %s: Debian packages %s; npm packages %s (install scripts %s); python wheels %s; environment %s; working directory %s; %s and %s; %s. Declaration `%s`.",
		d.Name, d.Base, listOr(quoteAll(d.DebianPackages), "none"), listOr(quoteAll(d.NPMPackages), "none"), onOff(d.NPMScripts),
		listOr(quoteAll(wheels), "none"), listOr(quoteAll(slices.Sorted(maps.Keys(d.Env))), "none"), workdir,
		code(d.Start, "start code"), ready, golden, templates.Key(*d))
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
