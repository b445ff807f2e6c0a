// Command minimal is the least a Go program can do to run python print(1)
// the way `stockade run --driver runc` does: the runc driver alone (the same
// bundle, guest, cgroup and clean-up), without the engine, configuration,
// tools or anything else the stockade binary links for its daemon. The
// one-shot benchmark times it (-parts) to show what any CLI built in Go
// costs on top of the sandbox itself.
//
//	minimal GUEST ROOTFS
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/sandbox"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: minimal GUEST ROOTFS")
		os.Exit(2)
	}
	out, err := run(os.Args[1], os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "minimal:", err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}

func run(guest, rootfs string) ([]byte, error) {
	ctx := context.Background()
	d, err := runc.New(runc.Config{GuestPath: guest})
	if err != nil {
		return nil, err
	}
	sb, err := d.Create(ctx, sandbox.Spec{Image: sandbox.Image{Name: "python", Rootfs: rootfs}})
	if err != nil {
		return nil, err
	}
	py := image.Runtimes["python"]
	res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{
		File:    sandbox.File{Name: py.FileName, Data: []byte("print(1)")},
		Argv:    py.Interpreter,
		Env:     []string{"PATH=/usr/bin:/bin"},
		Timeout: sandbox.DefaultLimits().Timeout,
	})
	if derr := sb.Destroy(ctx); err == nil {
		err = derr
	}
	if err != nil {
		return nil, err
	}
	return res.Stdout, nil
}
