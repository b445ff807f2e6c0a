package tools

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/templates"
)

// FieldChange is one changed field of a record, rendered for people.
type FieldChange struct {
	Field string // e.g. "egress.allow", "limits.memory"
	Old   string // "(absent)" when the tool did not exist
	New   string // "(absent)" when the tool no longer exists
	// Added and Removed are the entries that appeared and disappeared, for
	// list fields (runtimes, mounts, egress, credentials).
	Added, Removed []string
}

func (f FieldChange) String() string {
	s := fmt.Sprintf("%s: %s -> %s", f.Field, f.Old, f.New)
	var d []string
	for _, a := range f.Added {
		d = append(d, "+"+a)
	}
	for _, r := range f.Removed {
		d = append(d, "-"+r)
	}
	if len(d) > 0 && f.Old != absent && f.New != absent {
		s += " (" + strings.Join(d, ", ") + ")"
	}
	return s
}

// Change is the difference between two versions of one tool's record. The
// daemon writes one audit event per Change between loads.
type Change struct {
	Tool string
	// Added and Removed say that the tool appeared or disappeared.
	Added, Removed bool
	// Fields are the changed fields in record order; empty when the records
	// are equal.
	Fields []FieldChange
	// ReviewRequired is set when the egress allowlist (domains or ports) or
	// the credential list grew. Shrinking never requires review.
	ReviewRequired bool
	// Growth lists what grew, e.g. "egress.allow +api.example.com".
	Growth []string
	// OldFingerprint and NewFingerprint are the records' fingerprints;
	// empty for an absent side.
	OldFingerprint, NewFingerprint string
	// Template is the change of the tool's template declaration (from or
	// to none, the zero Template); nil when it did not change. Added
	// packages, wheels or files are growth (Fields template.*).
	Template *templates.Change
}

// Changed reports whether the records differ.
func (c Change) Changed() bool { return c.OldFingerprint != c.NewFingerprint }

// String renders the change, one field per line:
//
//	tool "sql-reader" changed (review required: egress.allow +api.example.com)
//	  egress.allow: none -> [api.example.com] (+api.example.com)
func (c Change) String() string {
	var b strings.Builder
	verb := "changed"
	switch {
	case c.Added:
		verb = "added"
	case c.Removed:
		verb = "removed"
	case !c.Changed():
		verb = "unchanged"
	}
	fmt.Fprintf(&b, "tool %q %s", c.Tool, verb)
	if c.ReviewRequired {
		fmt.Fprintf(&b, " (review required: %s)", strings.Join(c.Growth, ", "))
	}
	b.WriteString("\n")
	for _, f := range c.Fields {
		b.WriteString("  " + f.String() + "\n")
	}
	return b.String()
}

const absent = "(absent)"

// Diff compares two versions of a tool's record. Only the record counts:
// limits are compared with defaults applied, lists as sets, and Source not
// at all.
func Diff(old, new Tool) Change {
	o, n := canonical(old), canonical(new)
	c := Change{Tool: new.Name, OldFingerprint: Fingerprint(old), NewFingerprint: Fingerprint(new)}
	if c.Tool == "" {
		c.Tool = old.Name
	}
	c.Fields, c.Growth = diffRecords(&o, &n)
	c.ReviewRequired = len(c.Growth) > 0
	c.Template = templateChange(&o, &n)
	return c
}

// templateChange returns the change of the template declarations of two
// canonical records, or nil.
func templateChange(o, n *canonicalRecord) *templates.Change {
	var od, nd templates.Template
	if o != nil && o.decl != nil {
		od = *o.decl
	}
	if n != nil && n.decl != nil {
		nd = *n.decl
	}
	if c := templates.Diff(od, nd); !c.Empty() {
		return &c
	}
	return nil
}

// DiffStored diffs a record stored earlier as Canonical bytes (in the
// audit trail, say) against the tool as loaded now.
func DiffStored(old []byte, t Tool) (Change, error) {
	var o canonicalRecord
	if err := json.Unmarshal(old, &o); err != nil {
		return Change{}, fmt.Errorf("decoding stored record of tool %q: %w", t.Name, err)
	}
	if err := o.bindDecl(); err != nil {
		return Change{}, fmt.Errorf("decoding stored record of tool %q: %w", t.Name, err)
	}
	n := canonical(t)
	sum := sha256.Sum256(old)
	c := Change{Tool: t.Name, OldFingerprint: "sha256:" + hex.EncodeToString(sum[:]), NewFingerprint: Fingerprint(t)}
	c.Fields, c.Growth = diffRecords(&o, &n)
	c.ReviewRequired = len(c.Growth) > 0
	c.Template = templateChange(&o, &n)
	return c, nil
}

// DiffSets compares two loads of the tools and returns a Change for each
// tool added, removed or changed, by name. The built-in default tool never
// changes and is left out.
func DiffSets(old, new *Set) []Change {
	names := append(old.Names(), new.Names()...)
	slices.Sort(names)
	names = slices.Compact(names)
	var cs []Change
	for _, name := range names {
		if name == DefaultName {
			continue
		}
		ot, oerr := old.Get(name)
		nt, nerr := new.Get(name)
		switch {
		case oerr != nil:
			n := canonical(nt)
			c := Change{Tool: name, Added: true, NewFingerprint: Fingerprint(nt)}
			c.Fields, c.Growth = diffRecords(nil, &n)
			c.ReviewRequired = len(c.Growth) > 0
			c.Template = templateChange(nil, &n)
			cs = append(cs, c)
		case nerr != nil:
			o := canonical(ot)
			c := Change{Tool: name, Removed: true, OldFingerprint: Fingerprint(ot)}
			c.Fields, _ = diffRecords(&o, nil)
			c.Template = templateChange(&o, nil)
			cs = append(cs, c)
		default:
			if c := Diff(ot, nt); c.Changed() {
				cs = append(cs, c)
			}
		}
	}
	return cs
}

// recordField is one field of a canonical record: how to render it, and for
// lists, its entries.
type recordField struct {
	name   string
	render func(c *canonicalRecord) string
	list   func(c *canonicalRecord) []string // nil for scalar fields
	// growth: the field's growth requires review: for a list, its added
	// entries; for a boolean, its turning true (from false, none or
	// absent).
	growth bool
}

var recordFields = []recordField{
	{name: "capability", render: func(c *canonicalRecord) string { return c.Capability }},
	{name: "runtimes", render: func(c *canonicalRecord) string { return listOr(c.Runtimes, "all") },
		list: func(c *canonicalRecord) []string { return c.Runtimes }},
	{name: "input_trust", render: func(c *canonicalRecord) string { return orUnknown(string(c.InputTrust)) }},
	{name: "tier", render: func(c *canonicalRecord) string { return orUnknown(string(c.Tier)) }},
	{name: "filesystem.mounts", render: func(c *canonicalRecord) string { return listOr(mountStrings(c), "none") },
		list: mountStrings},
	{name: "filesystem.scratch.size", render: func(c *canonicalRecord) string { return sandbox.FormatSize(c.Filesystem.ScratchBytes) }},
	{name: "filesystem.scratch.lifetime", render: func(c *canonicalRecord) string { return string(c.Filesystem.ScratchLifetime) }},
	{name: "egress.allow", render: func(c *canonicalRecord) string { return listOr(c.Egress.Allow, "none") },
		list: func(c *canonicalRecord) []string { return c.Egress.Allow }, growth: true},
	{name: "egress.ports", render: func(c *canonicalRecord) string { return listOr(portStrings(c), "none") },
		list: portStrings, growth: true},
	{name: "credentials", render: func(c *canonicalRecord) string { return listOr(c.Credentials, "none") },
		list: func(c *canonicalRecord) []string { return c.Credentials }, growth: true},
	{name: "limits.timeout", render: func(c *canonicalRecord) string {
		return sandbox.FormatDuration(time.Duration(c.Limits.TimeoutMS) * time.Millisecond)
	}},
	{name: "limits.memory", render: func(c *canonicalRecord) string { return sandbox.FormatSize(c.Limits.MemoryBytes) }},
	{name: "limits.cpu", render: func(c *canonicalRecord) string { return strconv.FormatFloat(c.Limits.CPU, 'g', -1, 64) }},
	{name: "limits.pids", render: func(c *canonicalRecord) string { return strconv.FormatInt(c.Limits.Pids, 10) }},
	{name: "limits.output_cap", render: func(c *canonicalRecord) string { return sandbox.FormatSize(c.Limits.OutputCapBytes) }},
	{name: "accept_risk", render: func(c *canonicalRecord) string {
		if c.AcceptRisk == nil {
			return "none"
		}
		return fmt.Sprintf("by %s: %s", orUnknown(c.AcceptRisk.By), orUnknown(c.AcceptRisk.Reason))
	}},

	// The template: its name, then its declaration field by field. Added
	// packages, wheels and files, and npm install scripts turned on, are
	// growth: code and data the tool's sandboxes did not hold or run
	// (templates.Change.Grows).
	{name: "template", render: func(c *canonicalRecord) string {
		if c.Template == nil {
			return "none"
		}
		return c.Template.Name
	}},
	{name: "template.base", render: declString(func(d *templates.Template) string { return d.Base })},
	{name: "template.debian_packages", render: declList(func(d *templates.Template) []string { return d.DebianPackages }),
		list: declItems(func(d *templates.Template) []string { return d.DebianPackages }), growth: true},
	{name: "template.npm_packages", render: declList(func(d *templates.Template) []string { return d.NPMPackages }),
		list: declItems(func(d *templates.Template) []string { return d.NPMPackages }), growth: true},
	// Install scripts turned on run packages' code at build time, as
	// root in the build sandbox, that did not run before.
	{name: "template.npm_scripts", render: declString(func(d *templates.Template) string { return strconv.FormatBool(d.NPMScripts) }), growth: true},
	{name: "template.python_wheels", render: declList(wheelStrings), list: declItems(wheelStrings), growth: true},
	{name: "template.files", render: declList(fileStrings), list: declItems(fileStrings), growth: true},
	{name: "template.env", render: declList(func(d *templates.Template) []string {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(d.Env)) {
			kv = append(kv, k+"="+d.Env[k])
		}
		return kv
	})},
	{name: "template.workdir", render: declString(func(d *templates.Template) string { return orDefault(d.Workdir) })},
	{name: "template.start", render: declString(func(d *templates.Template) string { return codeDigest(d.Start) })},
	{name: "template.ready", render: declString(func(d *templates.Template) string { return codeDigest(d.Ready) })},
	{name: "template.golden", render: declString(func(d *templates.Template) string { return strconv.FormatBool(d.Golden) })},
}

// declString renders a scalar of a record's template declaration, "none"
// without one.
func declString(f func(*templates.Template) string) func(*canonicalRecord) string {
	return func(c *canonicalRecord) string {
		if c.decl == nil {
			return "none"
		}
		return f(c.decl)
	}
}

// declItems returns a list of a record's template declaration.
func declItems(f func(*templates.Template) []string) func(*canonicalRecord) []string {
	return func(c *canonicalRecord) []string {
		if c.decl == nil {
			return nil
		}
		return f(c.decl)
	}
}

func declList(f func(*templates.Template) []string) func(*canonicalRecord) string {
	items := declItems(f)
	return func(c *canonicalRecord) string { return listOr(items(c), "none") }
}

func wheelStrings(d *templates.Template) []string {
	s := make([]string, len(d.PythonWheels))
	for i, w := range d.PythonWheels {
		s[i] = w.String()
	}
	return s
}

func fileStrings(d *templates.Template) []string {
	s := make([]string, len(d.Files))
	for i, f := range d.Files {
		s[i] = f.String()
	}
	return s
}

func orDefault(s string) string {
	if s == "" {
		return "default"
	}
	return s
}

// codeDigest names start or ready code by its size and digest: the code
// itself may be long.
func codeDigest(s string) string {
	if s == "" {
		return "none"
	}
	sum := sha256.Sum256([]byte(s))
	return fmt.Sprintf("%d bytes, sha256:%s", len(s), hex.EncodeToString(sum[:6]))
}

// diffRecords compares two canonical records; nil is an absent tool. It
// returns the changed fields and the growth that requires review.
func diffRecords(o, n *canonicalRecord) (fields []FieldChange, growth []string) {
	for _, f := range recordFields {
		fc := FieldChange{Field: f.name, Old: absent, New: absent}
		var oldList, newList []string
		if o != nil {
			fc.Old = f.render(o)
			if f.list != nil {
				oldList = f.list(o)
			}
		}
		if n != nil {
			fc.New = f.render(n)
			if f.list != nil {
				newList = f.list(n)
			}
		}
		if fc.Old == fc.New {
			continue
		}
		switch {
		case f.list != nil:
			fc.Added = without(newList, oldList)
			fc.Removed = without(oldList, newList)
			if f.growth {
				for _, a := range fc.Added {
					growth = append(growth, f.name+" +"+a)
				}
			}
		case f.growth && fc.New == "true":
			growth = append(growth, f.name+" "+fc.Old+" -> true")
		}
		fields = append(fields, fc)
	}
	return fields, growth
}

// without returns the entries of a that are not in b.
func without(a, b []string) []string {
	var d []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			d = append(d, x)
		}
	}
	return d
}

func listOr(l []string, empty string) string {
	if len(l) == 0 {
		return empty
	}
	return "[" + strings.Join(l, ", ") + "]"
}

func mountStrings(c *canonicalRecord) []string {
	s := make([]string, len(c.Filesystem.Mounts))
	for i, m := range c.Filesystem.Mounts {
		s[i] = m.Source + ":" + m.Target
	}
	return s
}

func portStrings(c *canonicalRecord) []string {
	s := make([]string, len(c.Egress.Ports))
	for i, p := range c.Egress.Ports {
		s[i] = strconv.Itoa(p)
	}
	return s
}
