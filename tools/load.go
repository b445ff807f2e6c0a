package tools

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/stockade-sh/stockade/internal/strictyaml"
	"github.com/stockade-sh/stockade/sandbox"
)

// Load reads the tools defined in path, a YAML file or a directory whose
// *.yaml files are read in name order (hidden files skipped, no recursion),
// validates them with opts and returns them with the default tool. An empty
// path yields the default tool alone.
//
// A configuration with any problem is refused whole: the error is then a
// Problems listing all of them. An error reading path wraps ErrNotFound or
// ErrInvalidArgument.
//
// A tools file is a mapping with one key, tools:
//
//	tools:
//	  - name: sql-reader
//	    capability: code.execute
//	    runtimes: [python]
//	    limits: {timeout: 10s, memory: 256MiB, cpu: 0.5, pids: 64}
//	    input_trust: trusted
//	    tier: container
//	    filesystem:
//	      mounts:
//	        - {source: /var/lib/stockade/data/sales, target: /data/sales}
//	      scratch: {size: 32MiB, lifetime: invocation}
//	    egress: none
//	    credentials: none
//	    template: analytics      # optional: a template of opts.Templates
func Load(path string, opts Options) (*Set, error) {
	if path == "" {
		return finish(nil, nil, opts)
	}
	files, err := strictyaml.Files(path, "tools")
	if err != nil {
		return nil, err
	}
	var (
		ts []Tool
		ps Problems
	)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading tools file: %w", strictyaml.ClassifyFSError(err))
		}
		fts, fps := Parse(f, data)
		ts = append(ts, fts...)
		ps = append(ps, fps...)
	}
	return finish(ts, ps, opts)
}

// LoadList is Load for a list of tools written in another YAML file (the
// tools: key of a configuration file): list is its sequence node, and
// problems name file and the lines of the list.
func LoadList(file string, list *yaml.Node, opts Options) (*Set, error) {
	top := &yaml.Node{Kind: yaml.MappingNode, Line: list.Line, Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Tag: "!!str", Value: "tools", Line: list.Line}, list}}
	ts, ps := parseTop(file, top)
	return finish(ts, ps, opts)
}

// finish validates the tools parsed with their problems, and returns them
// with the default tool, or all the problems.
func finish(ts []Tool, ps Problems, opts Options) (*Set, error) {
	for i, t := range ts {
		if t.Template == "" {
			continue
		}
		if tmpl, err := opts.Templates.Get(t.Template); err == nil {
			ts[i].template = &tmpl
		}
	}
	ps = append(ps, Validate(ts, opts)...)
	if len(ps) > 0 {
		sortProblems(ps)
		return nil, ps
	}
	s := newSet(ts, DefaultFor(opts.DefaultTier))
	s.templates = opts.Templates
	return s, nil
}

// Parse decodes one tools file, named file in problems, and returns its
// tools, unvalidated, with the problems of the decoding itself: YAML syntax,
// unknown fields, values of the wrong form, sizes and durations that do
// not parse. Each problem names the key path and the form the key takes.
// Load runs Validate on the result.
func Parse(file string, data []byte) ([]Tool, Problems) {
	top, line, msg := strictyaml.Document(data, "tools")
	if msg != "" {
		return nil, Problems{{Source: strictyaml.LineOf(file, line), Rule: RuleYAMLSyntax, Message: msg}}
	}
	if top == nil {
		return nil, nil
	}
	return parseTop(file, top)
}

// toolPathRE matches the start of a key path inside the nth tool.
var toolPathRE = regexp.MustCompile(`^tools\[\d+\]\.?`)

// parseTop decodes the top-level mapping of a tools file.
func parseTop(file string, top *yaml.Node) ([]Tool, Problems) {
	at := func(line int) string { return strictyaml.LineOf(file, line) }
	if top.Kind != yaml.MappingNode {
		return nil, Problems{{Source: at(top.Line), Rule: RuleYAMLType,
			Message: `a tools file is a mapping with one key, "tools:", holding a list of tools`}}
	}
	items := toolItems(top)
	toolAt := func(line int) (name string) {
		for _, it := range items {
			if it.line <= line {
				name = it.name
			}
		}
		return name
	}

	// Every problem of the decoding is collected, so that one run reports
	// all of them. Paths are given from the tool (limits.cpu), which the
	// problem names.
	var ps Problems
	var f fileYAML
	for _, p := range strictyaml.Decode(top, &f) {
		rel := toolPathRE.ReplaceAllString(p.Path, "")
		inTool := rel != p.Path
		pr := Problem{Source: at(p.Line), Rule: RuleYAMLType, Message: p.Error()}
		if inTool {
			pr.Tool = toolAt(p.Line)
			if rel != "" {
				pr.Message = rel + ": " + p.Message
			}
		}
		switch p.Kind {
		case strictyaml.UnknownKey:
			where := "the top level"
			switch {
			case inTool && rel == "":
				where = "the tool"
			case inTool:
				where = rel
			case p.Path != "":
				where = p.Path
			}
			pr.Rule, pr.Message = RuleUnknownField, unknownField(p.Key, where, p.Hint)
		case strictyaml.RepeatedKey:
			if inTool && rel != "" {
				pr.Message = "in " + rel + ": " + p.Message
			}
		}
		ps = append(ps, pr)
	}

	ts := make([]Tool, 0, len(f.Tools))
	for i, y := range f.Tools {
		var it toolItem
		if i < len(items) {
			it = items[i]
		}
		t, tps := y.tool(at(it.line), at)
		for _, l := range it.mountLines {
			t.mountAt = append(t.mountAt, at(l))
		}
		ts = append(ts, t)
		ps = append(ps, tps...)
	}
	return ts, ps
}

type toolItem struct {
	line       int
	name       string
	mountLines []int // the line of each entry of filesystem.mounts
}

// toolItems returns the position and name of each entry of the tools list
// of the top-level mapping top.
func toolItems(top *yaml.Node) []toolItem {
	var items []toolItem
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "tools" || top.Content[i+1].Kind != yaml.SequenceNode {
			continue
		}
		for _, it := range top.Content[i+1].Content {
			ti := toolItem{line: it.Line}
			if it.Kind == yaml.MappingNode {
				if n := mapValue(it, "name"); n != nil && n.Kind == yaml.ScalarNode {
					ti.name = n.Value
				}
				if ms := mapValue(mapValue(it, "filesystem"), "mounts"); ms != nil && ms.Kind == yaml.SequenceNode {
					for _, m := range ms.Content {
						ti.mountLines = append(ti.mountLines, m.Line)
					}
				}
			}
			items = append(items, ti)
		}
	}
	return items
}

// mapValue returns the value of key in the mapping n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// fieldHints explain the unknown fields people are likely to write.
var fieldHints = map[string]string{
	"read_only": "mounts are always read-only",
	"readonly":  "mounts are always read-only",
	"ro":        "mounts are always read-only",
	"rw":        "mounts are always read-only",
	"writable":  "mounts are always read-only; the writable scratch is filesystem.scratch",
	"network":   "the record's network line is egress",
	"driver":    "the tier picks the driver",
	"trust":     "did you mean input_trust?",
	"tmp":       "did you mean tmp_size?",
}

// unknownField is the message of an unknown field in where: the hint of
// fieldHints, then the decoder's (the known fields).
func unknownField(field, where, known string) string {
	msg := fmt.Sprintf("unknown field %q in %s", field, where)
	var hints []string
	for _, h := range []string{fieldHints[field], known} {
		if h != "" {
			hints = append(hints, h)
		}
	}
	if len(hints) > 0 {
		msg += " (" + strings.Join(hints, "; ") + ")"
	}
	return msg
}

// The YAML shapes. Scalars that need parsing are strings here and parsed in
// tool, so that a bad value is a problem naming its tool.
type fileYAML struct {
	Tools []toolYAML `yaml:"tools"`
}

type toolYAML struct {
	Name        string          `yaml:"name"`
	Capability  string          `yaml:"capability"`
	Runtimes    []string        `yaml:"runtimes"`
	Limits      limitsYAML      `yaml:"limits"`
	InputTrust  string          `yaml:"input_trust"`
	Tier        string          `yaml:"tier"`
	Filesystem  filesystemYAML  `yaml:"filesystem"`
	Egress      egressYAML      `yaml:"egress"`
	Credentials credentialsYAML `yaml:"credentials"`
	AcceptRisk  *acceptRiskYAML `yaml:"accept_risk"`
	Template    string          `yaml:"template"`
}

type limitsYAML struct {
	Timeout   string  `yaml:"timeout"`
	Memory    string  `yaml:"memory"`
	CPU       float64 `yaml:"cpu"`
	Pids      int64   `yaml:"pids"`
	TmpSize   string  `yaml:"tmp_size"`
	OutputCap string  `yaml:"output_cap"`
}

type filesystemYAML struct {
	Mounts  []mountYAML `yaml:"mounts"`
	Scratch scratchYAML `yaml:"scratch"`
}

type mountYAML struct {
	Source string `yaml:"source"`
	Target string `yaml:"target"`
}

type scratchYAML struct {
	Size     string `yaml:"size"`
	Lifetime string `yaml:"lifetime"`
}

type acceptRiskYAML struct {
	By     string `yaml:"by"`
	Reason string `yaml:"reason"`
}

// lineProblem is a problem found while decoding a custom-shaped field.
type lineProblem struct {
	line       int
	rule, text string
}

// egressYAML is "none" or {allow: [...], ports: [...]}.
type egressYAML struct {
	set      bool // the field was a mapping
	allow    []string
	ports    []int
	problems []lineProblem
}

func (*egressYAML) YAMLForm() string { return "none or {allow: [domains], ports: [ports]}" }

func (e *egressYAML) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Value != "none" {
			e.problems = append(e.problems, lineProblem{n.Line, RuleEgress, fmt.Sprintf("egress: want %s, got %q", e.YAMLForm(), n.Value)})
		}
		return nil
	case yaml.MappingNode:
	default:
		e.problems = append(e.problems, lineProblem{n.Line, RuleEgress, fmt.Sprintf("egress: want %s, got a list", e.YAMLForm())})
		return nil
	}
	e.set = true
	var m struct {
		Allow []string `yaml:"allow"`
		Ports []int    `yaml:"ports"`
	}
	for _, p := range strictyaml.Decode(n, &m) {
		if p.Kind == strictyaml.UnknownKey {
			e.problems = append(e.problems, lineProblem{p.Line, RuleUnknownField, unknownField(p.Key, "egress", p.Hint)})
			continue
		}
		e.problems = append(e.problems, lineProblem{p.Line, RuleEgress, "egress." + p.Error()})
	}
	e.allow, e.ports = m.Allow, m.Ports
	return nil
}

// credentialsYAML is "none" or a list of broker operation names.
type credentialsYAML struct {
	ops      []string
	problems []lineProblem
}

func (*credentialsYAML) YAMLForm() string { return "none or a list of broker operation names" }

func (c *credentialsYAML) UnmarshalYAML(n *yaml.Node) error {
	switch {
	case n.Kind == yaml.ScalarNode && n.Value == "none":
	case n.Kind == yaml.SequenceNode:
		for _, p := range strictyaml.Decode(n, &c.ops) {
			c.problems = append(c.problems, lineProblem{p.Line, RuleCredentials, "credentials" + p.Error()})
		}
	default:
		what := "a mapping"
		if n.Kind == yaml.ScalarNode {
			what = strconv.Quote(n.Value)
		}
		c.problems = append(c.problems, lineProblem{n.Line, RuleCredentials, fmt.Sprintf("credentials: want %s, got %s", c.YAMLForm(), what)})
	}
	return nil
}

// tool converts the decoded YAML of one tool, defined at src.
func (y toolYAML) tool(src string, at func(int) string) (Tool, Problems) {
	var ps Problems
	add := func(rule, format string, a ...any) {
		ps = append(ps, Problem{Source: src, Tool: y.Name, Rule: rule, Message: fmt.Sprintf(format, a...)})
	}
	t := Tool{
		Name:       y.Name,
		Capability: y.Capability,
		Runtimes:   y.Runtimes,
		InputTrust: Trust(y.InputTrust),
		Tier:       sandbox.Tier(y.Tier),
		Template:   y.Template,
		Source:     src,
	}

	l := y.Limits
	if l.Timeout != "" {
		d, err := sandbox.ParseDuration(l.Timeout)
		switch {
		case err != nil:
			add(RuleLimits, "limits.timeout: %v", err)
		case d <= 0:
			add(RuleLimits, "limits.timeout: %s must be more than 0", l.Timeout)
		default:
			t.Limits.Timeout = d
		}
	}
	size := func(field, s string) int64 {
		if s == "" {
			return 0
		}
		n, err := sandbox.ParseSize(s)
		if err != nil {
			add(RuleLimits, "%s: %v", field, err)
		}
		return n
	}
	t.Limits.Memory = size("limits.memory", l.Memory)
	t.Limits.CPU = l.CPU
	t.Limits.Pids = l.Pids
	t.Limits.OutputCap = size("limits.output_cap", l.OutputCap)
	tmp := size("limits.tmp_size", l.TmpSize)
	scratch := size("filesystem.scratch.size", y.Filesystem.Scratch.Size)
	switch {
	case tmp != 0 && scratch != 0 && tmp != scratch:
		add(RuleScratch, "filesystem.scratch.size (%s) and limits.tmp_size (%s) are the same /tmp tmpfs and disagree; set one", y.Filesystem.Scratch.Size, l.TmpSize)
	case scratch != 0:
		t.Limits.TmpSize = scratch
	default:
		t.Limits.TmpSize = tmp
	}
	t.Filesystem.ScratchLifetime = Lifetime(y.Filesystem.Scratch.Lifetime)
	for _, m := range y.Filesystem.Mounts {
		t.Filesystem.Mounts = append(t.Filesystem.Mounts, sandbox.Mount{Source: m.Source, Target: m.Target})
	}

	for _, p := range y.Egress.problems {
		ps = append(ps, Problem{Source: at(p.line), Tool: y.Name, Rule: p.rule, Message: p.text})
	}
	if y.Egress.set && len(y.Egress.allow) == 0 && len(y.Egress.ports) == 0 {
		add(RuleEgress, "egress lists nothing; write egress: none")
	}
	for _, d := range y.Egress.allow {
		t.Egress.Allow = append(t.Egress.Allow, strings.ToLower(strings.TrimSuffix(d, ".")))
	}
	t.Egress.Ports = y.Egress.ports

	for _, p := range y.Credentials.problems {
		ps = append(ps, Problem{Source: at(p.line), Tool: y.Name, Rule: p.rule, Message: p.text})
	}
	t.Credentials = y.Credentials.ops

	if y.AcceptRisk != nil {
		t.AcceptRisk = &AcceptRisk{By: y.AcceptRisk.By, Reason: y.AcceptRisk.Reason}
	}
	return t, ps
}

// sortProblems orders problems by file and line, keeping the order of
// problems at the same place; problems without a place come first.
func sortProblems(ps Problems) {
	key := func(p Problem) (string, int) {
		i := strings.LastIndexByte(p.Source, ':')
		if i < 0 {
			return p.Source, 0
		}
		n, err := strconv.Atoi(p.Source[i+1:])
		if err != nil {
			return p.Source, 0
		}
		return p.Source[:i], n
	}
	sort.SliceStable(ps, func(i, j int) bool {
		fi, li := key(ps[i])
		fj, lj := key(ps[j])
		if fi != fj {
			return fi < fj
		}
		return li < lj
	})
}
