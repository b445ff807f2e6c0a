package image

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/templates"
)

// BenchmarkTemplateBuild builds a shell template with one small Debian
// package (jq, with libjq1 and libonig5) and a file, in a store of its
// own each round: the first build has no cache (it resolves jq against
// the mirror, downloads and installs it in a runsc build sandbox,
// copies the file, hardens, checks and hashes the tree); then the same
// declaration is built again, unchanged, which the store answers from
// its cache (the check of that: the rebuild reports no stage and gives
// the first build's image). It prints one table, the medians and their
// ratio; run it with -benchtime=5x for five rounds.
func BenchmarkTemplateBuild(b *testing.B) {
	if testing.Short() {
		b.Skip("skipping real template builds in -short mode")
	}
	requireTemplateBuild(b, "shell")
	ctx := b.Context()
	var first, again []time.Duration
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		s, data := templateStore(b, "shell")
		writeTree(b, data, map[string]string{"conf.json": `{"answer": 42}`})
		tpl := templates.Template{
			Name:           "bench",
			Base:           "shell",
			DebianPackages: []string{"jq"},
			Files:          []templates.File{{Source: filepath.Join(data, "conf.json"), Target: "/opt/bench/conf.json"}},
			Start:          `jq -e '.answer == 42' /opt/bench/conf.json`,
		}
		opts := TemplateOptions{StateDir: b.TempDir(), Sources: TemplateSources{DataRoot: data}}
		b.StartTimer()
		start := time.Now()
		m, err := s.BuildTemplate(ctx, tpl, opts)
		built := time.Now()
		if err != nil {
			b.Fatalf("the first build: %v", err)
		}
		st := &stages{}
		opts.Progress = st.progress
		m2, err := s.BuildTemplate(ctx, tpl, opts)
		done := time.Now()
		if err != nil || m2.Digest != m.Digest {
			b.Fatalf("the rebuild: %s, %v; want the first build's %s", m2.Digest, err, m.Digest)
		}
		if got := st.get(); len(got) != 0 {
			b.Fatalf("the unchanged rebuild went through stages %v, want none (a cache hit)", got)
		}
		first = append(first, built.Sub(start))
		again = append(again, done.Sub(built))
	}
	b.StopTimer()
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	var out strings.Builder
	fmt.Fprintf(&out, "a shell template with jq and one file, built in a store of its own (no cache), then built again unchanged; median of %d each\n\n", len(first))
	fmt.Fprintf(&out, "| build                      |     median |    slowest |  vs first |\n")
	fmt.Fprintf(&out, "| -------------------------- | ---------: | ---------: | --------: |\n")
	for _, r := range []struct {
		name string
		ds   []time.Duration
	}{{"first (no cache)", first}, {"unchanged rebuild (cache)", again}} {
		fmt.Fprintf(&out, "| %-26s | %10s | %10s | %8.5fx |\n", r.name, ms(med(r.ds)), ms(slices.Max(r.ds)),
			float64(med(r.ds))/float64(med(first)))
	}
	b.ReportMetric(float64(med(first))/float64(time.Millisecond), "ms-first")
	b.ReportMetric(float64(med(again))/float64(time.Millisecond), "ms-rebuild")
	// Printed, not logged: the testing package cuts a benchmark's log to
	// ten lines.
	fmt.Print("\n" + out.String() + "\n")
}
