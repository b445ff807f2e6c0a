// Command oneshot measures one-shot execution side by side, interleaved in
// one run so that machine noise hits every variant alike: `stockade run`
// (the whole CLI: process start, validate, create, exec, destroy) and the
// engine's one-shot run in process (what the daemon does per invocation)
// against a raw `runc run` / `runsc run` of an equivalent bundle (same
// profile, python started directly as PID 1), the same with python started
// as a child of PID 1 (what any design with an agent in the sandbox costs),
// and the bare interpreter in a chroot; the drivers' one-shot run with the
// sandbox direct (the daemon owns the guest's channel) and detached
// (through a shim, package supervisor): what the supervisor costs; and the
// engine's one-shot run of a tool with a data mount of 10,000 files, whose
// tree is checked for sockets and credentials directories before each run. -parts adds the runtimes with
// /bin/true and with the guest agent alone as PID 1 (the runtime's own cost
// and what starting the guest adds to it), and ./bench/oneshot/minimal, the
// least a Go CLI can be for the same run (what any CLI in Go costs).
//
//	go run ./bench/oneshot [-n 30] [-parts] [-stockade bin/stockade]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// variant is a timed variant and the one its median is compared with.
type variant struct {
	*table.Variant
	base string
}

func main() {
	n := flag.Int("n", 30, "runs of each variant")
	bin := flag.String("stockade", "bin/stockade", "stockade binary")
	dataDir := flag.String("data-dir", "/var/lib/stockade", "image store")
	parts := flag.Bool("parts", false, "also time what a run is made of: the runtime with /bin/true, and with the guest agent alone (it exits at once), as PID 1; and the least a Go CLI can be (./bench/oneshot/minimal)")
	flag.Parse()
	if err := run(*n, *bin, *dataDir, *parts); err != nil {
		fmt.Fprintln(os.Stderr, "oneshot:", err)
		os.Exit(1)
	}
}

func run(n int, bin, dataDir string, parts bool) error {
	img, err := image.Open(dataDir).Resolve("python")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "stockade-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cli := func(argv ...string) func() error { return table.Command("1\n", nil, argv...) }
	cfg := config.Default()
	cfg.DataDir = dataDir
	guest, err := guestbin.Install(cfg.BinDir())
	if err != nil {
		return err
	}
	py := []string{"/usr/bin/python3", "-c", "print(1)"}
	// The "child" bundles run python as a child of a PID 1 that waits for
	// it (dash, which the image has), as the guest agent does: the cost of
	// any design with an agent in the sandbox, whatever the agent does.
	child := []string{"/bin/sh", "-c", "/usr/bin/python3 -c 'print(1)'; exit $?"}
	rawBundle := func(name string, cpu float64, args []string) (string, error) {
		l := sandbox.DefaultLimits()
		l.CPU = cpu
		o := oci.Options{ID: name, Spec: sandbox.Spec{Image: img}, Limits: l, GuestPath: guest, CgroupsPath: "/stockade-bench/" + name}
		switch {
		case strings.HasSuffix(name, "-runc"):
			// runc's sandboxes have a user namespace; host ids just
			// below the range the driver draws from.
			o.HostUIDBase = sandbox.FirstHostID - 2
		case strings.HasSuffix(name, "-runsc"):
			// gVisor's sandboxes have the user-space kernel's profile:
			// its seccomp filter (which the Sentry compiles at every
			// start), RLIMIT_NPROC and the pids headroom.
			o.Kernel = oci.UserSpaceKernel
		}
		s, err := oci.Build(o)
		if err != nil {
			return "", err
		}
		s.Process.Args = args
		dir := filepath.Join(tmp, name)
		return dir, oci.WriteBundle(dir, s)
	}
	bundles := map[string]string{}
	for _, b := range []struct {
		name string
		cpu  float64
		args []string
	}{
		{"raw-runc", runc.DefaultCPU, py},
		{"child-runc", runc.DefaultCPU, child},
		{"raw-runsc", gvisor.DefaultCPU, py},
		{"child-runsc", gvisor.DefaultCPU, child},
		{"true-runc", runc.DefaultCPU, []string{"/bin/true"}},
		{"guest-runc", runc.DefaultCPU, []string{profile.GuestPath}},
		{"true-runsc", gvisor.DefaultCPU, []string{"/bin/true"}},
		{"guest-runsc", gvisor.DefaultCPU, []string{profile.GuestPath}},
	} {
		if bundles[b.name], err = rawBundle(b.name, b.cpu, b.args); err != nil {
			return err
		}
	}
	runcArgs := func(bundle string) []string {
		return []string{"runc", "--root", filepath.Join(tmp, "runc-state"), "run", "--bundle", bundles[bundle], "bench-" + bundle}
	}
	runscArgs := func(bundle string) []string {
		return []string{"runsc", "--root", filepath.Join(tmp, "runsc-state"), "--platform=systrap", "--network=none", "--oci-seccomp", "--overlay2=none", "--host-uds=none", "run", "--bundle", bundles[bundle], "bench-" + bundle}
	}
	runcCmd := func(bundle string) func() error { return cli(runcArgs(bundle)...) }
	runscCmd := func(bundle string) func() error { return cli(runscArgs(bundle)...) }
	// silent runs argv, which must exit 0, whatever it prints (the guest
	// prints its greeting, then exits when its stdin ends).
	silent := func(argv []string) func() error {
		return func() error {
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %v: %q", strings.Join(argv, " "), err, out)
			}
			return nil
		}
	}
	if cfg.DataRoot, cfg.Tools, err = mountedTool(tmp); err != nil {
		return err
	}
	eng, err := wiring.Engine(cfg)
	if err != nil {
		return err
	}
	inProcess := func(driver string) func() error { return inProcessAs(eng, "", driver) }
	// The drivers alone, each sandbox direct (the daemon owns the
	// guest's channel, the one-shot route) or detached (a shim owns it and
	// serves the guest on a socket: what a long-lived sandbox costs).
	exe, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	shim := []string{exe, "shim"}
	rc, err := runc.New(runc.Config{StateDir: filepath.Join(tmp, "drv-runc"), GuestPath: guest, Shim: shim})
	if err != nil {
		return err
	}
	gv, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(tmp, "drv-gvisor"), GuestPath: guest, Shim: shim})
	if err != nil {
		return err
	}
	viaDriver := func(d sandbox.Driver, detached bool) func() error { return driverOneShot(d, img, detached) }
	v := func(name, base string, run func() error) variant {
		return variant{Variant: &table.Variant{Name: name, Run: run}, base: base}
	}
	vs := []variant{
		v("engine one-shot, runc (daemon)", "runc run (raw bundle)", inProcess("runc")),
		v("engine one-shot, runc, a 10,000-file mount (vs the row above)", "engine one-shot, runc (daemon)", inProcessAs(eng, mountedToolName, "")),
		v("driver one-shot, runc, direct", "runc run (raw bundle)", viaDriver(rc, false)),
		v("driver one-shot, runc, through the shim (vs the row above)", "driver one-shot, runc, direct", viaDriver(rc, true)),
		v("stockade run --driver runc", "runc run (raw bundle)", cli(bin, "run", "--driver", "runc", "--runtime", "python", "-c", "print(1)")),
		v("runc run (raw bundle)", "", runcCmd("raw-runc")),
		v("runc run (raw, python as a child)", "runc run (raw bundle)", runcCmd("child-runc")),
		v("engine one-shot, gvisor (daemon)", "runsc run (raw bundle)", inProcess("gvisor")),
		v("driver one-shot, gvisor, direct", "runsc run (raw bundle)", viaDriver(gv, false)),
		v("driver one-shot, gvisor, through the shim (vs the row above)", "driver one-shot, gvisor, direct", viaDriver(gv, true)),
		v("stockade run --driver gvisor", "runsc run (raw bundle)", cli(bin, "run", "--driver", "gvisor", "--runtime", "python", "-c", "print(1)")),
		v("runsc run (raw bundle)", "", runscCmd("raw-runsc")),
		v("runsc run (raw, python as a child)", "runsc run (raw bundle)", runscCmd("child-runsc")),
		v("chroot python3 (bare)", "", cli(append([]string{"chroot", img.Rootfs}, py...)...)),
	}
	if parts {
		minimal := filepath.Join(tmp, "minimal")
		if out, err := exec.Command("go", "build", "-trimpath", "-o", minimal, "./bench/oneshot/minimal").CombinedOutput(); err != nil {
			return fmt.Errorf("building ./bench/oneshot/minimal (run the benchmark from the repository's root): %v: %s", err, out)
		}
		vs = append(vs,
			v("minimal Go CLI, runc driver only", "runc run (raw bundle)", cli(minimal, guest, img.Rootfs)),
			v("minimal Go CLI, start and exit only", "", func() error {
				// Without arguments it exits at once, with status 2.
				if err := exec.Command(minimal).Run(); err == nil {
					return fmt.Errorf("%s without arguments succeeded", minimal)
				}
				return nil
			}),
			v("runc run (raw, /bin/true)", "", silent(runcArgs("true-runc"))),
			v("runc run (raw, the guest alone)", "runc run (raw, /bin/true)", silent(runcArgs("guest-runc"))),
			v("runsc run (raw, /bin/true)", "", silent(runscArgs("true-runsc"))),
			v("runsc run (raw, the guest alone)", "runsc run (raw, /bin/true)", silent(runscArgs("guest-runsc"))),
		)
	}
	timed := make([]*table.Variant, len(vs))
	byName := map[string]*table.Variant{}
	for i, v := range vs {
		timed[i], byName[v.Name] = v.Variant, v.Variant
	}
	if err := table.Interleave(n, timed); err != nil {
		return err
	}
	fmt.Printf("one-shot python print(1), %d runs each, interleaved\n\n", n)
	// The interval is the ratio's 95% bootstrap interval over this run's
	// samples (table.RatioInterval): how far the noise could move it.
	t := table.New("variant", "median", "p95", "median vs raw runtime", "95% interval")
	for _, v := range vs {
		ratio, interval := "", ""
		if b := byName[v.base]; b != nil {
			ratio, interval = table.Ratio(v.Pct(50), b.Pct(50)), table.RatioInterval(v.Samples, b.Samples, 50)
		}
		t.Row(v.Name, table.MS(v.Pct(50)), table.MS(v.Pct(95)), ratio, interval)
	}
	t.Print(os.Stdout)
	return nil
}

// inProcessAs runs python print(1) on eng as tool (empty: the default
// tool), on driver (empty: the tool's tier).
func inProcessAs(eng *engine.Engine, tool, driver string) func() error {
	return func() error {
		res, err := eng.Run(context.Background(), engine.Request{Runtime: "python", Tool: tool, Driver: driver, Code: []byte("print(1)")})
		if err == nil && res.Stdout != "1\n" {
			err = fmt.Errorf("unexpected result %+v", res)
		}
		return err
	}
}

// driverOneShot runs python print(1) in a new sandbox of d, detached
// (through a shim) or not, and destroys it.
func driverOneShot(d sandbox.Driver, img sandbox.Image, detached bool) func() error {
	return func() error {
		ctx := context.Background()
		sb, err := d.Create(ctx, sandbox.Spec{Image: img, Detached: detached})
		if err != nil {
			return err
		}
		res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{
			File: sandbox.File{Name: "main.py", Data: []byte("print(1)")},
			Argv: []string{"/usr/bin/python3", "{file}"},
		})
		if err == nil && string(res.Stdout) != "1\n" {
			err = fmt.Errorf("unexpected result %+v", res)
		}
		if derr := sb.Destroy(ctx); err == nil {
			err = derr
		}
		return err
	}
}

// mountedToolName is the tool mountedTool defines.
const mountedToolName = "sales-report"

// mountedTool makes, in dir, a data root whose sales/ holds 10,000 files in
// 100 directories, and a tools file defining a trusted container-tier tool
// that mounts it, and returns the two. The engine checks the tree below the
// mount before each run; it remembers the directories that have not
// changed for a second, so the files are made a second before the timing
// starts, as a data directory's are long before the runs that read it.
func mountedTool(dir string) (root, file string, err error) {
	root = filepath.Join(dir, "data")
	for d := range 100 {
		sub := filepath.Join(root, "sales", fmt.Sprintf("region-%d", d/10), fmt.Sprintf("month-%d", d))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return "", "", err
		}
		for f := range 100 {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("day-%d.csv", f)), []byte("region,total\n"), 0o644); err != nil {
				return "", "", err
			}
		}
	}
	file = filepath.Join(dir, "tools.yaml")
	yaml := fmt.Sprintf(`tools:
  - name: %s
    input_trust: trusted
    tier: container
    runtimes: [python]
    filesystem:
      mounts:
        - {source: %s, target: /data/sales}
`, mountedToolName, filepath.Join(root, "sales"))
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		return "", "", err
	}
	time.Sleep(1100 * time.Millisecond)
	return root, file, nil
}
