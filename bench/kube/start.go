package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/kernel"
	"github.com/stockade-sh/stockade/sandbox"
)

// phases are one run's parts: the sandbox's Create (zero when it was
// created ahead), the first result (the program's, or the kernel's start
// and its first cell) and the Destroy.
type phases struct{ create, first, destroy time.Duration }

// variant is a timed variant whose runs have phases; Samples are their
// sums, the run's whole time.
type variant struct {
	table.Variant
	target                 string
	run                    func(ctx context.Context) (phases, error)
	create, first, destroy []time.Duration
	// base is the variant whose median this one's is compared with.
	base *variant
}

// interleave runs every variant once untimed (a warm-up), then n rounds
// of each once, in table.Order's order, and keeps the phases of the timed
// runs: table.Interleave's rounds, with a sandbox created ahead left out
// of the time.
func interleave(ctx context.Context, n int, vs []*variant) error {
	for i := -1; i < n; i++ {
		for _, j := range table.Order(i, len(vs)) {
			v := vs[j]
			if err := ctx.Err(); err != nil {
				return err
			}
			p, err := v.run(ctx)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", v.target, v.Name, err)
			}
			if i >= 0 {
				v.create, v.first, v.destroy = append(v.create, p.create), append(v.first, p.first), append(v.destroy, p.destroy)
				v.Samples = append(v.Samples, p.create+p.first+p.destroy)
			}
		}
	}
	return nil
}

// oneShotReq is the one-shot program: python print(1), written to the
// sandbox as the engine writes the code it runs.
var oneShotReq = sandbox.ExecRequest{
	File: sandbox.File{Name: "main.py", Data: []byte("print(1)")},
	Argv: []string{"/usr/bin/python3", "{file}"},
	Env:  engine.ProgramEnv(),
}

// sessionSpec is a session's sandbox on t, as the engine's OpenSession
// asks for it: the daemon's default /workspace, detached where the driver
// re-attaches.
func sessionSpec(t target, img sandbox.Image) sandbox.Spec {
	return sandbox.Spec{Image: img, Workspace: int64(config.Default().Sessions.WorkspaceSize), Detached: t.detach,
		Labels: map[string]string{"stockade.bench": "kube"}}
}

// kernelSpec is a python session's kernel, as the engine starts it.
func kernelSpec() (sandbox.KernelSpec, error) {
	return kernel.Spec("python", kernel.Options{Cwd: engine.WorkspaceDir, Env: engine.ProgramEnv()})
}

// How a variant's sandbox is made.
const (
	cold   = iota // Create, timed
	ahead         // Create, before the timer
	pooled        // CreateUnbound before the timer, then Bind timed with the first result
)

// timed runs a sandbox's life on t: its creation (timed when cold), then
// first (after a Bind when pooled), then Destroy, which runs also when
// first fails.
func timed(ctx context.Context, t target, spec sandbox.Spec, how int, first func(context.Context, sandbox.Sandbox) error) (p phases, err error) {
	start := time.Now()
	var sb sandbox.Sandbox
	if how == pooled {
		sb, err = t.driver.(sandbox.Binder).CreateUnbound(ctx, spec)
	} else {
		sb, err = t.driver.Create(ctx, spec)
	}
	if err != nil {
		return p, fmt.Errorf("Create: %w", err)
	}
	if how == cold {
		p.create = time.Since(start)
	}
	start = time.Now()
	if how == pooled {
		// What the engine's pool gives a run: its labels, no other
		// limits (the kubernetes driver cannot change memory or CPU).
		err = t.driver.(sandbox.Binder).Bind(ctx, sb, sandbox.Binding{Labels: map[string]string{"stockade.bench.run": "pooled"}})
		if err != nil {
			err = fmt.Errorf("Bind: %w", err)
		}
	}
	if err == nil {
		err = first(ctx, sb)
	}
	p.first = time.Since(start)
	start = time.Now()
	if derr := sb.Destroy(context.WithoutCancel(ctx)); err == nil && derr != nil {
		err = fmt.Errorf("Destroy: %w", derr)
	}
	p.destroy = time.Since(start)
	return p, err
}

// oneShot runs python print(1) in sb and checks its output.
func oneShot(ctx context.Context, sb sandbox.Sandbox) error {
	res, err := sandbox.Run(ctx, sb, oneShotReq)
	if err == nil && (res.Status != sandbox.StatusSucceeded || string(res.Stdout) != "1\n") {
		err = fmt.Errorf("unexpected result: %s %q %q", res.Status, res.Stdout, res.Stderr)
	}
	return err
}

// firstCell starts sb's python kernel and runs a cell print(1) in it.
func firstCell(ctx context.Context, sb sandbox.Sandbox) error {
	ks, ok := sb.(sandbox.Kernels)
	if !ok {
		return fmt.Errorf("sandbox %s has no kernels", sb.ID())
	}
	spec, err := kernelSpec()
	if err != nil {
		return err
	}
	k, err := ks.StartKernel(ctx, spec)
	if err != nil {
		return fmt.Errorf("StartKernel: %w", err)
	}
	return cell(ctx, k)
}

// cell runs print(1) in k, bounded to a minute, and checks its output.
func cell(ctx context.Context, k sandbox.Kernel) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := k.Run(ctx, sandbox.Cell{Code: "print(1)"})
	switch {
	case err != nil:
		return fmt.Errorf("cell: %w", err)
	case res.Status != sandbox.CellOK || string(res.Stdout) != "1\n":
		return fmt.Errorf("cell: %s %q %q %+v", res.Status, res.Stdout, res.Stderr, res.Error)
	}
	return nil
}

// startTables times the one-shot run and the session's first cell on
// every target, cold and with the sandbox created ahead, and the one-shot
// run also pooled (created unbound ahead, then bound: what a pool hit
// costs at the driver), interleaved in n rounds, and prints them: each
// against the local gVisor tier's of the same kind (the last target).
// Every target binds (sandbox.Binder); sessions are not pooled here (the
// kubernetes driver has no session pools: they need Reattach).
func startTables(ctx context.Context, n int, ts []target, img sandbox.Image) error {
	type kind struct {
		name  string
		spec  func(target) sandbox.Spec
		first func(context.Context, sandbox.Sandbox) error
		hows  []int
	}
	kinds := []kind{
		{"one-shot python print(1)", func(target) sandbox.Spec { return sandbox.Spec{Image: img} }, oneShot, []int{cold, ahead, pooled}},
		{"session: first cell print(1)", func(t target) sandbox.Spec { return sessionSpec(t, img) }, firstCell, []int{cold, ahead}},
	}
	for _, t := range ts {
		if _, ok := t.driver.(sandbox.Binder); !ok {
			return fmt.Errorf("%s: the driver cannot bind sandboxes: %s", t.name, t.driver.Capabilities().Lacks["Bind"])
		}
	}
	var tables [][]*variant
	var all []*variant
	for _, k := range kinds {
		var vs []*variant
		for _, how := range k.hows {
			name := [...]string{cold: "cold", ahead: "created ahead", pooled: "pooled (unbound ahead, Bind timed)"}[how]
			mk := func(t target, base *variant) *variant {
				return &variant{Variant: table.Variant{Name: name}, target: t.name, base: base,
					run: func(ctx context.Context) (phases, error) { return timed(ctx, t, k.spec(t), how, k.first) }}
			}
			// The local tier, last, is the others' base.
			base := mk(ts[len(ts)-1], nil)
			for _, t := range ts[:len(ts)-1] {
				vs = append(vs, mk(t, base))
			}
			vs = append(vs, base)
		}
		tables = append(tables, vs)
		all = append(all, vs...)
	}
	if err := interleave(ctx, n, all); err != nil {
		return err
	}
	fmt.Printf("One-shot and a session's first cell, at the driver: %d rounds of every variant, interleaved.\n", n)
	fmt.Printf("Create, first result, destroy and to the result (create and first result) are medians of their own;\nthe total is each run's sum (the engine destroys a one-shot's sandbox before it returns).\n")
	for i, vs := range tables {
		fmt.Printf("\n%s\n\n", kinds[i].name)
		t := table.New("driver", "sandbox", "create", "first result", "destroy", "to the result", "total, median", "p95", "median vs local gvisor").Labels(2)
		for _, v := range vs {
			ms := func(ds []time.Duration) string { return table.MS(table.Pct(ds, 50)) }
			create := ms(v.create)
			if v.Name != "cold" {
				create = "ahead"
			}
			var base *table.Variant
			if v.base != nil {
				base = &v.base.Variant
			}
			result := make([]time.Duration, len(v.first))
			for i := range result {
				result[i] = v.create[i] + v.first[i]
			}
			t.Row(v.target, v.Name, create, ms(v.first), ms(v.destroy), ms(result), table.MS(v.Pct(50)), table.MS(v.Pct(95)), ratio(&v.Variant, base))
		}
		t.Print(os.Stdout)
	}
	return nil
}
