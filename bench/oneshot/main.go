// Command oneshot measures one-shot execution side by side, interleaved in
// one run so that machine noise hits every variant alike: `stockade run`
// (the whole CLI: process start, validate, create, exec, destroy) and the
// engine's one-shot run in process (what the daemon does per invocation)
// against a raw `runc run` / `runsc run` of an equivalent bundle (same
// profile, python started directly as PID 1) and the bare interpreter in a
// chroot.
//
//	go run ./bench/oneshot [-n 30] [-stockade bin/stockade]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/sandbox"
)

type variant struct {
	name string
	base string // the variant this one is compared with
	argv []string
	// run, when set, is timed instead of running argv.
	run func() error
	dur []time.Duration
}

func main() {
	n := flag.Int("n", 30, "runs of each variant")
	bin := flag.String("stockade", "bin/stockade", "stockade binary")
	dataDir := flag.String("data-dir", "/var/lib/stockade", "image store")
	flag.Parse()
	if err := run(*n, *bin, *dataDir); err != nil {
		fmt.Fprintln(os.Stderr, "oneshot:", err)
		os.Exit(1)
	}
}

func run(n int, bin, dataDir string) error {
	img, err := image.Open(dataDir).Resolve("python")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "stockade-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	guest, err := os.Executable() // any file works as the mount source of the unused guest mount point
	if err != nil {
		return err
	}
	py := []string{"/usr/bin/python3", "-c", "print(1)"}
	rawBundle := func(name string, cpu float64) (string, error) {
		l := sandbox.DefaultLimits()
		l.CPU = cpu
		s, err := oci.Build(oci.Options{ID: name, Spec: sandbox.Spec{Image: img}, Limits: l, GuestPath: guest, CgroupsPath: "/stockade-bench/" + name})
		if err != nil {
			return "", err
		}
		s.Process.Args = py
		dir := filepath.Join(tmp, name)
		return dir, oci.WriteBundle(dir, s)
	}
	runcBundle, err := rawBundle("raw-runc", runc.DefaultCPU)
	if err != nil {
		return err
	}
	runscBundle, err := rawBundle("raw-runsc", gvisor.DefaultCPU)
	if err != nil {
		return err
	}
	eng, err := engine.Open(config.Default())
	if err != nil {
		return err
	}
	inProcess := func(driver string) func() error {
		return func() error {
			res, err := eng.Run(context.Background(), engine.Request{Runtime: "python", Driver: driver, Code: []byte("print(1)")})
			if err == nil && res.Stdout != "1\n" {
				err = fmt.Errorf("unexpected result %+v", res)
			}
			return err
		}
	}
	vs := []*variant{
		{name: "engine one-shot, runc (daemon)", base: "runc run (raw bundle)", run: inProcess("runc")},
		{name: "stockade run --driver runc", base: "runc run (raw bundle)", argv: []string{bin, "run", "--driver", "runc", "--runtime", "python", "-c", "print(1)"}},
		{name: "runc run (raw bundle)", argv: []string{"runc", "--root", filepath.Join(tmp, "runc-state"), "run", "--bundle", runcBundle, "bench-runc"}},
		{name: "engine one-shot, gvisor (daemon)", base: "runsc run (raw bundle)", run: inProcess("gvisor")},
		{name: "stockade run --driver gvisor", base: "runsc run (raw bundle)", argv: []string{bin, "run", "--driver", "gvisor", "--runtime", "python", "-c", "print(1)"}},
		{name: "runsc run (raw bundle)", argv: []string{"runsc", "--root", filepath.Join(tmp, "runsc-state"), "--platform=systrap", "--network=none", "--oci-seccomp", "--overlay2=none", "--host-uds=none", "run", "--bundle", runscBundle, "bench-runsc"}},
		{name: "chroot python3 (bare)", argv: append([]string{"chroot", img.Rootfs}, py...)},
	}
	// One warm-up round, then n interleaved rounds.
	for i := -1; i < n; i++ {
		for _, v := range vs {
			d, err := timeRun(v)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			if i >= 0 {
				v.dur = append(v.dur, d)
			}
		}
	}
	byName := map[string]*variant{}
	for _, v := range vs {
		byName[v.name] = v
	}
	fmt.Printf("one-shot python print(1), %d runs each, interleaved\n\n", n)
	fmt.Printf("| %-34s | %10s | %10s | %-22s |\n", "variant", "median", "p95", "median vs raw runtime")
	fmt.Printf("|%s|%s|%s|%s|\n", dashes(36), dashes(12), dashes(12), dashes(24))
	for _, v := range vs {
		ratio := ""
		if b := byName[v.base]; b != nil {
			ratio = fmt.Sprintf("%.2fx", float64(pct(v.dur, 50))/float64(pct(b.dur, 50)))
		}
		fmt.Printf("| %-34s | %10s | %10s | %-22s |\n", v.name, ms(pct(v.dur, 50)), ms(pct(v.dur, 95)), ratio)
	}
	return nil
}

func timeRun(v *variant) (time.Duration, error) {
	if v.run != nil {
		start := time.Now()
		err := v.run()
		return time.Since(start), err
	}
	cmd := exec.Command(v.argv[0], v.argv[1:]...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	if err != nil || string(out) != "1\n" {
		return 0, fmt.Errorf("%v: %q", err, out)
	}
	return d, nil
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func dashes(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = '-'
	}
	return string(b)
}
