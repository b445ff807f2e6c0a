package tools

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
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
	return c
}

// DiffStored diffs a record stored earlier as Canonical bytes (in the
// audit trail, say) against the tool as loaded now.
func DiffStored(old []byte, t Tool) (Change, error) {
	var o canonicalRecord
	if err := json.Unmarshal(old, &o); err != nil {
		return Change{}, fmt.Errorf("decoding stored record of tool %q: %w", t.Name, err)
	}
	n := canonical(t)
	sum := sha256.Sum256(old)
	c := Change{Tool: t.Name, OldFingerprint: "sha256:" + hex.EncodeToString(sum[:]), NewFingerprint: Fingerprint(t)}
	c.Fields, c.Growth = diffRecords(&o, &n)
	c.ReviewRequired = len(c.Growth) > 0
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
			cs = append(cs, c)
		case nerr != nil:
			o := canonical(ot)
			c := Change{Tool: name, Removed: true, OldFingerprint: Fingerprint(ot)}
			c.Fields, _ = diffRecords(&o, nil)
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
	growth bool                              // added entries require review
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
		if f.list != nil {
			fc.Added = without(newList, oldList)
			fc.Removed = without(oldList, newList)
			if f.growth {
				for _, a := range fc.Added {
					growth = append(growth, f.name+" +"+a)
				}
			}
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
