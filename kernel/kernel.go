// Package kernel holds Stockade's kernels, the long-lived interpreters of
// sessions, and starts them in a sandbox through its guest. A kernel keeps
// state from cell to cell and speaks the kernel wire of cmd/stockade-guest:
//
//   - python (python.py, run as `python3 -c SOURCE`): one namespace; the
//     value of a final expression as text/plain; exceptions as name, value
//     and traceback; matplotlib figures as image/png displays; sys.stdin
//     is the cell's stdin; SIGINT raises KeyboardInterrupt in the cell;
//   - node (node.js, run as `node -e SOURCE`): one global context,
//     evaluated as a console does (top-level await, declarations that
//     stay); the completion value as text/plain; process.stdin is the
//     cell's stdin; SIGINT stops the cell;
//   - shell: the guest binary's shell kernel mode (guest.ShellKernel)
//     keeping one shell, whose working directory and variables carry
//     over; the exit status of the cell's last command in
//     CellResult.ExitCode; SIGINT ends the cell's programs.
//
// The sources reach the sandbox in the kernel's argv, so that nothing of
// the host but the image and the guest is in the sandbox (the profile's
// code delivery rule) and a start is one request. Kernels run as the
// sandbox's user with the sandbox's profile; the guest and the client
// bound and validate what they say, and they keep it within those bounds
// themselves (a figure whose PNG exceeds guest.MaxDisplay is reported on
// stderr, not sent).
//
//	k, err := kernel.Start(ctx, c, kernel.Python, kernel.Options{Cwd: "/workspace"})
//	out, err := k.Run(ctx, "x = 1\nx + 1", guest.CellOptions{OutputCap: 1 << 20, MaxDisplays: 16})
//	// out.Result.Value: text/plain "2"
package kernel

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// The kernels, by the runtime whose image they run in.
const (
	Python = "python"
	Node   = "node"
	Shell  = "shell"
)

var (
	//go:embed python.py
	pythonSource string
	//go:embed node.js
	nodeSource string
)

// Options are where and how a kernel starts.
type Options struct {
	// Image is the runtime of the sandbox's image; empty means the
	// kernel's own. The shell kernel runs in every image (busybox sh in
	// the shell image, /bin/sh in the others); python and node only in
	// their own.
	Image string
	// Cwd is the kernel's working directory; empty means /tmp.
	Cwd string
	// Env is the kernel's whole environment; nil means the profile's
	// (profile.Default().Env). Nothing of the host's is ever added.
	Env []string
	// Preimport names modules the python kernel imports before it is
	// ready, as a warm pool's kernel does (numpy, pandas): they are in
	// sys.modules when the first cell runs, and nowhere else (not in the
	// cells' namespace, sys.argv or the environment). Nil means none; only
	// the python kernel takes it (ErrInvalidArgument otherwise).
	Preimport []string
}

// Request returns the request that starts the kernel name in an image of
// opts.Image. Errors are ErrInvalidArgument.
func Request(name string, opts Options) (guest.KernelRequest, error) {
	img := opts.Image
	if img == "" {
		img = name
	}
	rt, ok := image.Runtimes[img]
	if !ok {
		return guest.KernelRequest{}, fmt.Errorf("unknown image %q: %w", img, errdefs.ErrInvalidArgument)
	}
	var argv []string
	switch {
	case len(opts.Preimport) > 0 && name != Python:
		return guest.KernelRequest{}, fmt.Errorf("only the python kernel imports modules before it is ready, not the %s kernel: %w", name, errdefs.ErrInvalidArgument)
	case name == Shell && img == Shell:
		// busybox's sh: the image's /bin/sh is dash.
		argv = []string{profile.GuestPath, guest.ShellKernel, rt.Interpreter[0], "sh"}
	case name == Shell:
		argv = []string{profile.GuestPath, guest.ShellKernel, "/bin/sh"}
	case name == Python && img == Python:
		// The modules to import follow the source: they are the kernel's
		// arguments (python.py drops them).
		argv = append([]string{rt.Interpreter[0], "-c", pythonSource}, opts.Preimport...)
	case name == Node && img == Node:
		argv = []string{rt.Interpreter[0], "-e", nodeSource}
	case name == Python || name == Node:
		return guest.KernelRequest{}, fmt.Errorf("the %s kernel runs in the %s image, not in the %s image: %w", name, name, img, errdefs.ErrInvalidArgument)
	default:
		return guest.KernelRequest{}, fmt.Errorf("unknown kernel %q (known: python, node, shell): %w", name, errdefs.ErrInvalidArgument)
	}
	env := opts.Env
	if env == nil {
		env = profile.Default().Env
	}
	cwd := opts.Cwd
	if cwd == "" {
		cwd = "/tmp"
	}
	return guest.KernelRequest{Argv: argv, Env: env, Cwd: cwd}, nil
}

// Spec is Request as the sandbox contract's KernelSpec, for
// sandbox.Kernels.StartKernel.
func Spec(name string, opts Options) (sandbox.KernelSpec, error) {
	r, err := Request(name, opts)
	if err != nil {
		return sandbox.KernelSpec{}, err
	}
	return sandbox.KernelSpec{Argv: r.Argv, Env: r.Env, Cwd: r.Cwd}, nil
}

// Start starts the kernel name through the guest client c and waits until
// it is ready for cells. The caller owns the kernel: Stop ends it.
func Start(ctx context.Context, c *guest.Client, name string, opts Options) (*guest.Kernel, error) {
	req, err := Request(name, opts)
	if err != nil {
		return nil, err
	}
	return c.StartKernel(ctx, req)
}
