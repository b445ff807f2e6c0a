// Command sessions measures python cells in a live session against the
// one-shot runs of the same code and the bare interpreter, side by side and
// interleaved in one run (so that machine noise hits every variant alike),
// on runc and gVisor, through the whole capability layer over HTTP on
// loopback with approval none: POST /v1/sessions/{id}/exec against POST
// /v1/executions and `chroot ROOTFS python3 -c CODE`. The cells are
// `print(1)` and one using pandas, which an earlier cell of the session
// imported; the one-shots and the bare interpreter import it themselves.
// The sessions run their runtime's kernel (package kernel), as the daemon's
// do. It prints the table and whether the targets are met: a cell's
// round trip p50 at most 5 ms on runc and 10 ms on gVisor, the pandas cell
// at most 0.05x the one-shot that imports pandas. On gVisor it then
// pauses and resumes a session holding a 100 MiB DataFrame against a cold
// session rebuilding it (pause.go), and prints the checkpoints' sizes.
//
// It needs root, runc, runsc and the images (`make setup`); it builds the
// stockade binary for the shim of the sessions' sandboxes, installs the
// guest in a temporary directory, keeps its state in a temporary
// directory under -state-dir and its SQLite stores in another, listens on
// 127.0.0.1 only and stops by itself.
//
//	CGO_ENABLED=0 go run ./bench/sessions -n 200 -oneshot-n 20
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/daemon"
	"github.com/stockade-sh/stockade/bench/internal/python"
	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/sandbox"
)

func main() {
	n := flag.Int("n", 200, "cells of each kind timed per driver")
	oneshotN := flag.Int("oneshot-n", 20, "rounds: each runs every one-shot and the bare interpreter once and n/oneshot-n cells of each kind")
	dataDir := flag.String("data-dir", config.Default().DataDir, "image store")
	stateDir := flag.String("state-dir", "/run", "parent of the temporary state directory (a tmpfs, as in production)")
	pauseN := flag.Int("pause-n", 10, "rounds of pause/resume against a cold rebuild (at most n)")
	flag.Parse()
	if err := run(*n, *oneshotN, min(*pauseN, *n), *dataDir, *stateDir); err != nil {
		fmt.Fprintln(os.Stderr, "bench/sessions:", err)
		os.Exit(1)
	}
}

// cellTargets are issue 15's targets for a cell's round trip p50, by
// driver; pandasTarget is its target for the pandas cell's, as a fraction
// of the one-shot that imports pandas.
var cellTargets = map[string]time.Duration{"runc": 5 * time.Millisecond, "gvisor": 10 * time.Millisecond}

const pandasTarget = 0.05

// row is one line of the table: a variant and the variants its median is
// compared with (nil: no comparison).
type row struct {
	driver        string
	v             *table.Variant
	oneShot, bare *table.Variant
}

func run(n, oneshotN, pauseN int, dataDir, stateDir string) error {
	ctx := context.Background()
	images := image.Open(dataDir)
	img, err := images.Resolve("python")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "stockade-bench-sessions-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ds, remove, err := daemon.NewDrivers(tmp, stateDir)
	if err != nil {
		return err
	}
	defer remove()
	rc, gv := ds.Runc, ds.Gvisor

	per := max(n/oneshotN, 1)
	bare := &table.Variant{Name: "bare `print(1)`", Run: python.Bare(img.Rootfs, python.Print, python.PrintOut)}
	barePandas := &table.Variant{Name: "bare, importing pandas", Run: python.Bare(img.Rootfs, python.PandasOneShot, python.PandasOut)}
	var rows []row
	// targets are, by driver, the cells and the one-shot held to them.
	type targets struct {
		driver                          string
		cell, cellPandas, oneShotPandas *table.Variant
	}
	var (
		checks   []targets
		gvClient daemon.Client
	)
	for _, d := range []sandbox.Driver{rc, gv} {
		c, stop, err := serve(ctx, d, images, tmp, int64(4*(2*n+2*oneshotN)+100))
		if err != nil {
			return fmt.Errorf("%s: %w", d.Name(), err)
		}
		defer stop()
		if d == sandbox.Driver(gv) {
			gvClient = c
		}
		id, err := c.Session()
		if err != nil {
			return fmt.Errorf("%s: %w", d.Name(), err)
		}
		defer c.EndSession(id)
		if err := c.Cell(id, python.PandasImport, ""); err != nil {
			return fmt.Errorf("%s: importing pandas in the session: %w", d.Name(), err)
		}
		oneShot := &table.Variant{Name: "one-shot `print(1)`", Run: c.OneShot(python.Print, python.PrintOut)}
		oneShotPandas := &table.Variant{Name: "one-shot importing pandas", Run: c.OneShot(python.PandasOneShot, python.PandasOut)}
		cell := &table.Variant{Name: "cell `print(1)` in a live session", Runs: per, Run: func() error {
			return c.Cell(id, python.Print, python.PrintOut)
		}}
		cellPandas := &table.Variant{Name: "cell using pandas (imported by an earlier cell)", Runs: per, Run: func() error {
			return c.Cell(id, python.PandasCell, python.PandasOut)
		}}
		checks = append(checks, targets{d.Name(), cell, cellPandas, oneShotPandas})
		rows = append(rows,
			row{d.Name(), cell, oneShot, bare},
			row{d.Name(), oneShot, nil, bare},
			row{d.Name(), cellPandas, oneShotPandas, barePandas},
			row{d.Name(), oneShotPandas, nil, barePandas})
	}
	rows = append(rows, row{"none", bare, nil, nil}, row{"none", barePandas, nil, nil})

	vs := make([]*table.Variant, len(rows))
	for i, r := range rows {
		vs[i] = r.v
	}
	if err := table.Interleave(oneshotN, vs); err != nil {
		return err
	}
	fmt.Printf("python over HTTP, approval none: %d rounds, each one run of every one-shot and bare variant and %d cells of each kind per driver, interleaved\n\n", oneshotN, per)
	t := table.New("driver", "variant", "median", "p95", "median vs one-shot", "median vs bare").Labels(2)
	ratio := func(v, base *table.Variant) string {
		if base == nil {
			return ""
		}
		return table.Ratio(v.Pct(50), base.Pct(50))
	}
	for _, r := range rows {
		t.Row(r.driver, r.v.Name, table.MS(r.v.Pct(50)), table.MS(r.v.Pct(95)), ratio(r.v, r.oneShot), ratio(r.v, r.bare))
	}
	t.Print(os.Stdout)

	fmt.Println("\nTargets:")
	for _, c := range checks {
		p50, limit := c.cell.Pct(50), cellTargets[c.driver]
		fmt.Printf("- %s: a cell's round trip p50 %s, at most %s: %s\n", c.driver, table.MS(p50), table.MS(limit), met(p50 <= limit))
		p50, base := c.cellPandas.Pct(50), c.oneShotPandas.Pct(50)
		fmt.Printf("- %s: the pandas cell %s the one-shot, at most %.2fx: %s\n", c.driver, table.Ratio(p50, base), pandasTarget, met(float64(p50) <= pandasTarget*float64(base)))
	}
	return pauseBench(gvClient, pauseN)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// serve starts a daemon on d alone (daemon.Serve).
func serve(ctx context.Context, d sandbox.Driver, images engine.Images, tmp string, credits int64) (daemon.Client, func(), error) {
	eng, err := engine.New(map[string]sandbox.Driver{d.Name(): d}, d.Name(), images, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		return daemon.Client{}, nil, err
	}
	return daemon.Serve(ctx, eng, filepath.Join(tmp, d.Name()+".db"), "bench-sessions-"+d.Name(), credits)
}
