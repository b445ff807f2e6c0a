// Command kernel measures the python kernel side by side, interleaved in
// one run so that machine noise hits every variant alike, on runc and
// gVisor: a cell `print(1)` in a live kernel (its round trip through the
// guest's protocol: the cell sent, run, its output and result back) against
// the engine's one-shot run of the same code (what the daemon does per
// invocation: a sandbox created, the code run, the sandbox destroyed) and
// the bare interpreter in a chroot; and a cell using pandas, imported by an
// earlier cell, against a one-shot run that imports it.
//
//	go run ./bench/kernel [-n 30]
//
// It reads the images of the data directory (-data-dir) but writes nothing
// there: the guest agent and the drivers' state go to a temporary
// directory.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/python"
	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/kernel"
	"github.com/stockade-sh/stockade/sandbox"
)

func main() {
	n := flag.Int("n", 30, "runs of each variant")
	dataDir := flag.String("data-dir", "/var/lib/stockade", "data directory whose images are used")
	flag.Parse()
	if err := run(*n, *dataDir); err != nil {
		fmt.Fprintln(os.Stderr, "kernel:", err)
		os.Exit(1)
	}
}

// guestClienter is the drivers' access to the guest's protocol client.
type guestClienter interface {
	GuestClient() *guest.Client
}

func run(n int, dataDir string) error {
	store := image.Open(dataDir)
	if _, err := store.Current("python"); err != nil {
		return err
	}
	img, err := store.Resolve("python")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "stockade-bench-kernel-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	guestPath, err := guestbin.Install(filepath.Join(tmp, "bin"))
	if err != nil {
		return err
	}
	cfg := config.Default()
	cfg.DataDir, cfg.GuestPath, cfg.StateDir = dataDir, guestPath, filepath.Join(tmp, "state")
	eng, err := wiring.Engine(cfg)
	if err != nil {
		return err
	}
	ctx := context.Background()
	type tier struct {
		name   string
		driver sandbox.Driver
	}
	rd, err := runc.New(runc.Config{StateDir: filepath.Join(tmp, "runc"), GuestPath: guestPath})
	if err != nil {
		return err
	}
	gd, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(tmp, "gvisor"), GuestPath: guestPath})
	if err != nil {
		return err
	}
	tiers := []tier{{"runc", rd}, {"gvisor", gd}}

	type row struct {
		v *table.Variant
		// vsOneShot and vsBare are the variants whose medians this
		// one's is compared with.
		vsOneShot, vsBare string
	}
	var rows []row
	variants := map[string]*table.Variant{}
	add := func(r row) {
		rows = append(rows, r)
		variants[r.v.Name] = r.v
	}
	bareName := "chroot python3, print(1) (bare)"
	barePandasName := "chroot python3, importing pandas (bare)"
	for _, t := range tiers {
		sb, err := t.driver.Create(ctx, sandbox.Spec{Image: img, Labels: map[string]string{"stockade.bench": "kernel"}})
		if err != nil {
			return fmt.Errorf("creating a %s sandbox: %w", t.name, err)
		}
		defer sb.Destroy(context.Background())
		gc, ok := sb.(guestClienter)
		if !ok {
			return fmt.Errorf("the %s driver gives no guest client", t.name)
		}
		k, err := kernel.Start(ctx, gc.GuestClient(), kernel.Python, kernel.Options{})
		if err != nil {
			return fmt.Errorf("starting the python kernel on %s: %w", t.name, err)
		}
		if _, err := cell(k, python.PandasImport, ""); err != nil {
			return fmt.Errorf("importing pandas in the %s kernel: %w", t.name, err)
		}
		oneShot := "one-shot print(1), " + t.name
		oneShotPandas := "one-shot importing pandas, " + t.name
		add(row{v: &table.Variant{Name: "kernel cell print(1), " + t.name, Run: func() error {
			_, err := cell(k, python.Print, python.PrintOut)
			return err
		}}, vsOneShot: oneShot, vsBare: bareName})
		add(row{v: &table.Variant{Name: oneShot, Run: oneShotRun(eng, t.name, python.Print, python.PrintOut)}, vsBare: bareName})
		add(row{v: &table.Variant{Name: "kernel cell using pandas, " + t.name, Run: func() error {
			_, err := cell(k, python.PandasCell, python.PandasOut)
			return err
		}}, vsOneShot: oneShotPandas, vsBare: barePandasName})
		add(row{v: &table.Variant{Name: oneShotPandas, Run: oneShotRun(eng, t.name, python.PandasOneShot, python.PandasOut)}, vsBare: barePandasName})
	}
	add(row{v: &table.Variant{Name: bareName, Run: python.Bare(img.Rootfs, python.Print, python.PrintOut)}})
	add(row{v: &table.Variant{Name: barePandasName, Run: python.Bare(img.Rootfs, python.PandasOneShot, python.PandasOut)}})

	timed := make([]*table.Variant, len(rows))
	for i, r := range rows {
		timed[i] = r.v
	}
	if err := table.Interleave(n, timed); err != nil {
		return err
	}
	fmt.Printf("python kernel cells vs one-shot runs, %d runs each, interleaved\n\n", n)
	t := table.New("variant", "median", "p95", "median vs one-shot", "median vs bare")
	ratio := func(v *table.Variant, base string) string {
		if b := variants[base]; b != nil {
			return table.Ratio(v.Pct(50), b.Pct(50))
		}
		return ""
	}
	for _, r := range rows {
		t.Row(r.v.Name, table.MS(r.v.Pct(50)), table.MS(r.v.Pct(95)), ratio(r.v, r.vsOneShot), ratio(r.v, r.vsBare))
	}
	t.Print(os.Stdout)
	return nil
}

// cell runs code in k and checks that it succeeds with stdout want (not
// checked when want is empty).
func cell(k *guest.Kernel, code, want string) (*guest.CellOutput, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := k.Run(ctx, code, guest.CellOptions{OutputCap: 1 << 20, MaxDisplays: 1})
	switch {
	case err != nil:
		return nil, err
	case out.Result.Status != guest.CellOK:
		return nil, fmt.Errorf("cell %q: %+v, stderr %q", code, out.Result.Error, out.Stderr)
	case want != "" && string(out.Stdout) != want:
		return nil, fmt.Errorf("cell %q: got stdout %q, want %q", code, out.Stdout, want)
	}
	return out, nil
}

// oneShotRun returns a Run of the engine's one-shot run of code on driver.
func oneShotRun(eng *engine.Engine, driver, code, want string) func() error {
	return func() error {
		res, err := eng.Run(context.Background(), engine.Request{Runtime: "python", Driver: driver, Code: []byte(code)})
		if err == nil && res.Stdout != want {
			err = fmt.Errorf("unexpected result %+v", res)
		}
		return err
	}
}
