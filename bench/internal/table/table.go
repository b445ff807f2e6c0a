// Package table holds what Stockade's benchmarks share: variants timed in
// interleaved rounds, so that machine noise hits every variant alike,
// percentiles of their samples, and the Markdown tables they print.
//
//	vs := []*table.Variant{{Name: "a", Run: runA}, {Name: "b", Run: runB}}
//	if err := table.Interleave(30, vs); err != nil { ... }
//	t := table.New("variant", "median", "p95")
//	for _, v := range vs {
//		t.Row(v.Name, table.MS(v.Pct(50)), table.MS(v.Pct(95)))
//	}
//	t.Print(os.Stdout)
package table

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Variant is one thing a benchmark times.
type Variant struct {
	Name string
	// Run is one timed run; an error ends the benchmark.
	Run func() error
	// Runs is how many times Interleave runs it in each round, one after
	// the other (zero means once): a variant much cheaper than the others
	// gets more samples without more rounds of the expensive ones.
	Runs int
	// Samples are the durations of the timed runs, in order.
	Samples []time.Duration
}

// Pct is the p-th percentile of the variant's samples.
func (v *Variant) Pct(p int) time.Duration { return Pct(v.Samples, p) }

// Interleave runs every variant once untimed (a warm-up: images imported,
// caches filled), then n rounds in which each variant runs Runs times, and
// appends the duration of each run to its Samples. Each round runs the
// variants in an order of its own (Order), so that no variant always runs
// in the wake of the same other one: the kernel still tearing down a
// gVisor sandbox, say, slows whatever comes next, and a fixed or merely
// rotated order would charge that to one variant only.
func Interleave(n int, vs []*Variant) error {
	for i := -1; i < n; i++ {
		for _, j := range Order(i, len(vs)) {
			v := vs[j]
			runs := max(v.Runs, 1)
			if i < 0 {
				runs = 1
			}
			for range runs {
				start := time.Now()
				if err := v.Run(); err != nil {
					return fmt.Errorf("%s: %w", v.Name, err)
				}
				if d := time.Since(start); i >= 0 {
					v.Samples = append(v.Samples, d)
				}
			}
		}
	}
	return nil
}

// Order is the order in which round i of an interleaved run runs its n
// variants: the list's own for the warm-up (i < 0), else a permutation
// drawn from a generator seeded with i, so that a rerun repeats it and,
// over the rounds, each variant follows each other one about equally
// often.
func Order(i, n int) []int {
	order := make([]int, n)
	for j := range order {
		order[j] = j
	}
	if i >= 0 {
		r := rand.New(rand.NewPCG(uint64(i), 0x5700cade))
		r.Shuffle(n, func(a, b int) { order[a], order[b] = order[b], order[a] })
	}
	return order
}

// Command returns a Run that executes argv with env added to this process's
// environment and fails unless it exits 0 with want as its whole standard
// output. Standard error is only shown when the run fails: the docker CLI,
// for one, warns there about flags it was given on purpose.
func Command(want string, env []string, argv ...string) func() error {
	return func() error {
		cmd := exec.Command(argv[0], argv[1:]...)
		if env != nil {
			cmd.Env = append(cmd.Environ(), env...)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || string(out) != want {
			return fmt.Errorf("%s: %v: stdout %q, stderr %q", strings.Join(argv, " "), err, out, stderr.Bytes())
		}
		return nil
	}
}

// Pct is the p-th percentile of ds (nearest rank, rounding down); zero for
// no samples. ds is not modified.
func Pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

// MS formats d in milliseconds: one decimal, two below 10 ms.
func MS(d time.Duration) string {
	ms := float64(d.Nanoseconds()) / 1e6
	if ms > -10 && ms < 10 {
		return fmt.Sprintf("%.2f ms", ms)
	}
	return fmt.Sprintf("%.1f ms", ms)
}

// Ratio formats a / b as "1.23x", with three decimals below 0.1x ("0.004x")
// so that a small ratio is not rounded away from the target it is held to;
// empty when b is zero.
func Ratio(a, b time.Duration) string {
	if b == 0 {
		return ""
	}
	return times(float64(a)/float64(b)) + "x"
}

// times formats a ratio as Ratio does, without the "x".
func times(r float64) string {
	if r < 0.1 {
		return fmt.Sprintf("%.3f", r)
	}
	return fmt.Sprintf("%.2f", r)
}

// RatioInterval is a 95% interval of the ratio of a's p-th percentile to
// b's, by the bootstrap: 2,000 times, each variant's samples are drawn
// again with replacement (the same number of them) and the ratio of the
// drawn percentiles taken; the interval runs from the 2.5th to the 97.5th
// percentile of those ratios. It says how far the one ratio a run prints
// could move with the noise its own samples show, so that a target that
// lies inside it is read as neither met nor missed with confidence. The
// generator is seeded, so that a run's samples always give the same
// interval. Empty when either has no samples.
func RatioInterval(a, b []time.Duration, p int) string {
	if len(a) == 0 || len(b) == 0 {
		return ""
	}
	const draws = 2000
	r := rand.New(rand.NewPCG(1, 0x5700cade))
	draw := func(ds []time.Duration, into []time.Duration) time.Duration {
		for i := range into {
			into[i] = ds[r.IntN(len(ds))]
		}
		return Pct(into, p)
	}
	da, db := make([]time.Duration, len(a)), make([]time.Duration, len(b))
	ratios := make([]float64, 0, draws)
	for range draws {
		if d := draw(b, db); d > 0 {
			ratios = append(ratios, float64(draw(a, da))/float64(d))
		}
	}
	if len(ratios) == 0 {
		return ""
	}
	slices.Sort(ratios)
	at := func(q float64) float64 { return ratios[int(q*float64(len(ratios)-1))] }
	return times(at(0.025)) + "-" + times(at(0.975)) + "x"
}

// Table is a Markdown table whose leading label columns (by default the
// first) are aligned left and the others right, padded so that it also
// reads well as plain text.
type Table struct {
	rows   [][]string // rows[0] is the header
	labels int
}

// New returns a table with the given column headers.
func New(header ...string) *Table { return &Table{rows: [][]string{header}, labels: 1} }

// Labels makes the first n columns labels, aligned left, and returns t.
func (t *Table) Labels(n int) *Table {
	t.labels = n
	return t
}

// Row appends a row; missing cells are empty, extra cells are dropped.
func (t *Table) Row(cells ...string) {
	r := make([]string, len(t.rows[0]))
	copy(r, cells)
	t.rows = append(t.rows, r)
}

// Print writes the table to w.
func (t *Table) Print(w io.Writer) {
	width := make([]int, len(t.rows[0]))
	for _, r := range t.rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c), 3)
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i < t.labels {
				b.WriteString("| " + c + pad + " ")
			} else {
				b.WriteString("| " + pad + c + " ")
			}
		}
		b.WriteString("|\n")
		io.WriteString(w, b.String())
	}
	line(t.rows[0])
	sep := make([]string, len(width))
	for i, n := range width {
		if i < t.labels {
			sep[i] = strings.Repeat("-", n)
		} else {
			sep[i] = strings.Repeat("-", n-1) + ":"
		}
	}
	line(sep)
	for _, r := range t.rows[1:] {
		line(r)
	}
}
