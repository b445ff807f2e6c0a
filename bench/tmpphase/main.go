package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"
	"io"
	"strings"
	"path/filepath"


	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/sandbox"
)

func main() {
	useG := len(os.Args) > 1 && os.Args[1] == "gvisor"
	cfg := config.Default()
	g, _ := guestbin.Install(cfg.BinDir()); if os.Getenv("GUEST") != "" { g = os.Getenv("GUEST") }
	var d sandbox.Driver
	cpu := runc.DefaultCPU
	kernel := oci.HostKernel
	rt := []string{"runc"}
	if useG {
		d, _ = gvisor.New(gvisor.Config{Binary: cfg.RunscPath, StateDir: cfg.StateDir + "/gvisor", GuestPath: g})
		cpu = gvisor.DefaultCPU
		kernel = oci.UserSpaceKernel
		rt = []string{"runsc", "--platform=systrap", "--network=none", "--oci-seccomp", "--overlay2=none", "--host-uds=none"}
	} else {
		d, _ = runc.New(runc.Config{Binary: cfg.RuncPath, StateDir: cfg.StateDir + "/runc", GuestPath: g})
	}
	img, _ := image.Open(cfg.ImageDir()).Resolve("python")
	tmp, _ := os.MkdirTemp("", "ph")
	defer os.RemoveAll(tmp)
	n := 0
	bundleG := func(gp string, args ...string) string {
		n++
		name := fmt.Sprint("b", n)
		l := sandbox.DefaultLimits()
		l.CPU = cpu
		s, err := oci.Build(oci.Options{ID: name, Spec: sandbox.Spec{Image: img}, Limits: l, GuestPath: gp, CgroupsPath: "/stockade-bench/" + name, Kernel: kernel})
		if err != nil { panic(err) }
		s.Process.Args = args
		dir := filepath.Join(tmp, name)
		if err := oci.WriteBundle(dir, s); err != nil { panic(err) }
		return dir
	}
	bundle := func(args ...string) string { return bundleG(g, args...) }
	raw := func(b string, extra ...string) func() error {
		return func() error {
			c := exec.Command(rt[0], append(append(append([]string{"--root", tmp + "/st"}, rt[1:]...), extra...), "run", "--bundle", b, "x")...)
			return c.Run()
		}
	}
	ctx := context.Background()
	pg := bundle("/.stockade/guest")
	rawPipe := func() error {
		c := exec.Command(rt[0], append(append([]string{"--root", tmp + "/st"}, rt[1:]...), "run", "--bundle", pg, "x")...)
		in, _ := c.StdinPipe()
		out, _ := c.StdoutPipe()
		var eb strings.Builder
		c.Stderr = &eb
		if err := c.Start(); err != nil { return err }
		b := make([]byte, 1)
		if _, err := out.Read(b); err != nil { return err }
		in.Close()
		io.Copy(io.Discard, out)
		return c.Wait()
	}
	cfg.GuestPath = g; eng, _ := engine.Open(cfg); _ = d; _ = rawPipe; _ = ctx; _ = eng
	drvName := "runc"
	if useG { drvName = "gvisor" }; _ = drvName
	drv := func(gp string, cpus ...float64) func() error {
		var dd sandbox.Driver
		if useG {
			dd, _ = gvisor.New(gvisor.Config{Binary: cfg.RunscPath, StateDir: cfg.StateDir + "/gvisor", GuestPath: gp})
		} else {
			dd, _ = runc.New(runc.Config{Binary: cfg.RuncPath, StateDir: cfg.StateDir + "/runc", GuestPath: gp})
		}
		return func() error {
			var l sandbox.Limits
			if len(cpus) > 0 { l.CPU = cpus[0] }
			sb, err := dd.Create(ctx, sandbox.Spec{Image: img, Limits: l})
			if err != nil { return err }
			res, err := sb.Exec(ctx, sandbox.ExecRequest{File: sandbox.File{Name: "main.py", Data: []byte("print(1)")}, Argv: []string{"/usr/bin/python3", "/tmp/main.py"}, Env: engine.ProgramEnv(), Timeout: 30 * time.Second})
			if err != nil { return err }
			if string(res.Stdout) != "1\n" { return fmt.Errorf("bad %q %q", res.Stdout, res.Stderr) }
			return sb.Destroy(ctx)
		}
	}
	vs := []*table.Variant{
		{Name: "raw python", Run: raw(bundle("/usr/bin/python3", "-c", "print(1)"))},
		{Name: "raw child python", Run: raw(bundle("/bin/sh", "-c", "/usr/bin/python3 -c 'print(1)'; exit $?"))},
		{Name: "driver old guest", Run: drv(g)},
		{Name: "driver newsig", Run: drv("/tmp/g-newsig")},
		{Name: "driver newsig nosec", Run: drv("/tmp/g-newsig-nosec")},
		{Name: "driver newsig notsync", Run: drv("/tmp/g-notsync")},
	}
	if err := table.Interleave(50, vs); err != nil { panic(err) }
	for _, v := range vs {
		fmt.Printf("%-30s %s %s\n", v.Name, table.MS(v.Pct(50)), table.MS(v.Pct(95)))
	}
}
