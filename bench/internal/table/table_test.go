package table

import (
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
	// One warm-up run each, then two rounds, the second starting at b.
	want := "a b a b b b b b b a "
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
