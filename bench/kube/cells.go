package main

import (
	"context"
	"fmt"
	"os"

	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/sandbox"
)

// cellTable times cells print(1) in one live python kernel of each kube
// target (over the pod's attach stream) and of a local gVisor sandbox
// through its shim (detached, as a session's) and direct (the guest's
// pipe held by this process), cells a round in n interleaved rounds, and
// prints each against the shim's: what the attach stream costs a cell.
func cellTable(ctx context.Context, n, cells int, kubes []target, gv sandbox.Driver, img sandbox.Image) error {
	ts := append(kubes[:len(kubes):len(kubes)],
		target{name: "local gvisor", driver: gv, detach: true},
		target{name: "local gvisor", driver: gv})
	channel := func(t target) string {
		switch {
		case t.driver != gv:
			return "the pod's attach stream"
		case t.detach:
			return "the shim (a session's)"
		}
		return "direct (a one-shot's pipe)"
	}
	spec, err := kernelSpec()
	if err != nil {
		return err
	}
	vs := make([]*table.Variant, len(ts))
	for i, t := range ts {
		sb, err := t.driver.Create(ctx, sessionSpec(t, img))
		if err != nil {
			return fmt.Errorf("%s: Create: %w", t.name, err)
		}
		defer sb.Destroy(context.WithoutCancel(ctx))
		k, err := sb.(sandbox.Kernels).StartKernel(ctx, spec)
		if err != nil {
			return fmt.Errorf("%s: StartKernel: %w", t.name, err)
		}
		vs[i] = &table.Variant{Name: channel(t), Runs: cells, Run: func() error { return cell(ctx, k) }}
	}
	if err := table.Interleave(n, vs); err != nil {
		return err
	}
	shim := vs[len(kubes)]
	fmt.Printf("\nThe guest's channel: cells print(1) in one live python kernel each, %d rounds of %d cells, interleaved\n\n", n, cells)
	t := table.New("driver", "channel", "median per cell", "p95", "median vs the shim", "median minus the shim's").Labels(2)
	for i, v := range vs {
		t.Row(ts[i].name, v.Name, table.MS(v.Pct(50)), table.MS(v.Pct(95)), ratio(v, shim), table.MS(v.Pct(50)-shim.Pct(50)))
	}
	t.Print(os.Stdout)
	return nil
}
