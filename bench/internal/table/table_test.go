package table

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestInterleaveRuns(t *testing.T) {
	var order []string
	v := func(name string, runs int) *Variant {
		return &Variant{Name: name, Runs: runs, Run: func() error {
			order = append(order, name)
			return nil
		}}
	}
	a, b := v("a", 0), v("b", 3)
	if err := Interleave(2, []*Variant{a, b}); err != nil {
		t.Fatal(err)
	}
	// One warm-up run each in the list's order, then each round in its
	// own order, b three times in a row.
	want := "a b "
	for i := range 2 {
		for _, j := range Order(i, 2) {
			want += []string{"a ", "b b b "}[j]
		}
	}
	got := ""
	for _, s := range order {
		got += s + " "
	}
	if got != want {
		t.Errorf("got runs %q, want %q", got, want)
	}
	for _, c := range []struct {
		v    *Variant
		want int
	}{{a, 2}, {b, 6}} {
		if len(c.v.Samples) != c.want {
			t.Errorf("%s: got %d samples, want %d", c.v.Name, len(c.v.Samples), c.want)
		}
	}
}

// TestOrderSpreadsPredecessors checks that, over the rounds of a run, each
// variant runs right after each other one: with a fixed or a rotated order
// a variant would always follow the same one and pay for its aftermath.
func TestOrderSpreadsPredecessors(t *testing.T) {
	for _, n := range []int{3, 6, 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			after := make([]map[int]bool, n)
			for j := range after {
				after[j] = map[int]bool{}
			}
			for i := range 30 * n {
				o := Order(i, n)
				if got := slices.Sorted(slices.Values(o)); !slices.Equal(got, Order(-1, n)) {
					t.Fatalf("round %d: got order %v, not a permutation of 0..%d", i, o, n-1)
				}
				for k := 1; k < len(o); k++ {
					after[o[k]][o[k-1]] = true
				}
			}
			for j, m := range after {
				if len(m) != n-1 {
					t.Errorf("variant %d: ran right after %d of the %d others, want all", j, len(m), n-1)
				}
			}
			if !slices.Equal(Order(7, n), Order(7, n)) {
				t.Errorf("round 7: two calls gave different orders")
			}
		})
	}
}

func TestRatio(t *testing.T) {
	for _, c := range []struct {
		a, b time.Duration
		want string
	}{
		{3, 2, "1.50x"},
		{1, 10, "0.10x"},
		{2, 1000, "0.002x"},
		{49, 1000, "0.049x"},
		{1, 0, ""},
	} {
		t.Run(c.want, func(t *testing.T) {
			if got := Ratio(c.a, c.b); got != c.want {
				t.Errorf("Ratio(%d, %d): got %q, want %q", c.a, c.b, got, c.want)
			}
		})
	}
}

// TestRatioInterval checks the bootstrap interval: a point when the
// samples do not vary, around the ratio of the medians when they do, and
// narrower with more samples of the same spread.
func TestRatioInterval(t *testing.T) {
	same := func(d time.Duration, n int) []time.Duration {
		ds := make([]time.Duration, n)
		for i := range ds {
			ds[i] = d
		}
		return ds
	}
	if got := RatioInterval(same(3, 10), same(2, 10), 50); got != "1.50-1.50x" {
		t.Errorf("constant samples: got %q, want 1.50-1.50x", got)
	}
	if got := RatioInterval(nil, same(2, 10), 50); got != "" {
		t.Errorf("no samples: got %q, want empty", got)
	}
	// a spreads evenly over 100..139 ms, b is 100 ms: the interval holds
	// the ratio of the medians and lies within the samples' 1.00-1.39x.
	spread := func(n int) []time.Duration {
		ds := make([]time.Duration, n)
		for i := range ds {
			ds[i] = time.Duration(100+40*i/n) * time.Millisecond
		}
		return ds
	}
	width := func(n int) float64 {
		a, b := spread(n), same(100*time.Millisecond, n)
		got := RatioInterval(a, b, 50)
		var lo, hi float64
		if _, err := fmt.Sscanf(got, "%f-%fx", &lo, &hi); err != nil {
			t.Fatalf("n=%d: got %q: %v", n, got, err)
		}
		point := float64(Pct(a, 50)) / float64(Pct(b, 50))
		if lo > point || hi < point || lo < 1.0 || hi > 1.4 {
			t.Errorf("n=%d: got interval %q, want one around %.3fx within 1.00-1.39x", n, got, point)
		}
		return hi - lo
	}
	if w20, w200 := width(20), width(200); w200 >= w20 {
		t.Errorf("interval width %.3f with 200 samples, not under %.3f with 20", w200, w20)
	}
}
