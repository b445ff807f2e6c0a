package main

import (
	"context"
	"fmt"
	"os"

	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/sandbox"
)

// cellTable times cells print(1) in one live python kernel of each kube
// target (over the pod's attach stream), of a local sandbox of the same
// runtime through its shim (detached, as a session's) and, for reference,
// of a local gVisor sandbox direct (the guest's pipe held by this
// process), cells a round in n interleaved rounds, and prints each pod's
// against the local shim of its runtime: what the attach stream costs a
// cell. kubes are the runc pods' target, then the gVisor pods'.
func cellTable(ctx context.Context, n, cells int, kubes []target, rc, gv sandbox.Driver, img sandbox.Image) error {
	localRunc := target{name: "local runc", driver: rc, detach: true}
	localGVisor := target{name: "local gvisor", driver: gv, detach: true}
	ts := []target{kubes[0], localRunc, kubes[1], localGVisor, {name: "local gvisor", driver: gv}}
	// base[i] is the index of the row row i is compared with.
	base := []int{1, 1, 3, 3, 3}
	channel := func(t target) string {
		switch {
		case t.driver != gv && t.driver != rc:
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
	fmt.Printf("\nThe guest's channel: cells print(1) in one live python kernel each, %d rounds of %d cells, interleaved\n\n", n, cells)
	t := table.New("driver", "channel", "median per cell", "p95", "median vs the local shim", "minus the local shim's").Labels(2)
	for i, v := range vs {
		b := vs[base[i]]
		t.Row(ts[i].name, v.Name, table.MS(v.Pct(50)), table.MS(v.Pct(95)), ratio(v, b)+" ("+ts[base[i]].name+")", table.MS(v.Pct(50)-b.Pct(50)))
	}
	t.Print(os.Stdout)
	return nil
}
