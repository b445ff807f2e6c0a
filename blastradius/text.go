package blastradius

import (
	"fmt"
	"strings"

	"github.com/stockade-sh/stockade/sandbox"
)

// Markdown renders the report for people: the findings of each section,
// each check marked ok or DEVIATION, the list of deviations, and a last
// line "deviations: N".
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Blast radius of tool `%s`\n\n", r.Tool)
	fmt.Fprintf(&b, "Probed %s in a %s sandbox (driver `%s`, %s image), as an invocation of the tool gets it.\n",
		r.Time.Format("2006-01-02 15:04:05Z"), r.Tier, r.Driver, r.Runtime)
	fmt.Fprintf(&b, "Record fingerprint `%s`; record limits: %d processes, %s memory, %s scratch.\n",
		r.RecordFingerprint, r.RecordLimits.Pids, sandbox.FormatSize(r.RecordLimits.MemoryBytes), sandbox.FormatSize(r.RecordLimits.TmpSizeBytes))
	for _, s := range r.Sections {
		fmt.Fprintf(&b, "\n## %s\n\n", s.Title)
		for _, f := range s.Facts {
			fmt.Fprintf(&b, "%s\n", f)
		}
		if len(s.Facts) > 0 {
			b.WriteString("\n")
		}
		if len(s.Table) > 1 {
			writeTable(&b, s.Table)
			b.WriteString("\n")
		}
		for _, c := range s.Checks {
			if c.Deviation {
				fmt.Fprintf(&b, "- **DEVIATION** %s: %s (expected: %s)\n", c.Subject, c.Observed, c.Expected)
			} else {
				fmt.Fprintf(&b, "- ok %s: %s (expected: %s)\n", c.Subject, c.Observed, c.Expected)
			}
		}
	}
	b.WriteString("\n## Deviations\n\n")
	if len(r.Deviations) == 0 {
		b.WriteString("None: everything the probe could reach is within the record.\n")
	}
	for _, c := range r.Deviations {
		fmt.Fprintf(&b, "- %s\n", c)
	}
	fmt.Fprintf(&b, "\ndeviations: %d\n", len(r.Deviations))
	return b.String()
}

// writeTable writes rows as a Markdown table; rows[0] is the header.
func writeTable(b *strings.Builder, rows [][]string) {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for i, row := range rows {
		b.WriteString("|")
		for _, c := range row {
			fmt.Fprintf(b, " %s |", cell(c))
		}
		b.WriteString("\n")
		if i == 0 {
			b.WriteString(strings.Repeat("|---", len(row)) + "|\n")
		}
	}
}
