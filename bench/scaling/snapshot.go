package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/python"
	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/kernel"
	"github.com/stockade-sh/stockade/sandbox"
)

// snapshotKind is a kernel state whose checkpoint is measured.
type snapshotKind struct {
	name  string
	setup string // the cells run before the checkpoint, as one
	check string // a cell run after the restore, which must print checkOut
	out   string
}

var snapshotKinds = []snapshotKind{
	{"idle python kernel (`x = 1`)", "x = 1", "print(x)", "1\n"},
	{"after `import pandas as pd` (and `x = 1`)", python.PandasImport + "\nx = 1", "print(x)\n" + python.PandasCell, "1\n" + python.PandasOut},
}

// snapshotResult is what the checkpoints of one kind measured.
type snapshotResult struct {
	kind                 snapshotKind
	allocated, apparent  []int64 // bytes of each checkpoint directory
	memory               []int64 // the sandbox's memory cgroup usage before it
	checkpoint, restored table.Variant
}

// snapshots saves n sandboxes of each kind with gVisor's Snapshotter, as
// a paused session would be: a detached sandbox with a python kernel
// (package kernel's, as a session's) that ran the kind's setup and is
// idle, and a /workspace of workspace bytes (0: none, the kernel in
// /tmp). Each checkpoint goes into a directory under dir, is measured
// (du's allocated blocks and apparent size), restored, checked (its
// kernel still holds the state) and removed.
func snapshots(ctx context.Context, gv *ocidriver.Snapshotting, img sandbox.Image, dir string, workspace int64, n int, v2 bool) ([]*snapshotResult, error) {
	cwd := engine.WorkspaceDir
	if workspace == 0 {
		cwd = "/tmp"
	}
	ks, err := kernel.Spec("python", kernel.Options{Cwd: cwd, Env: engine.ProgramEnv()})
	if err != nil {
		return nil, err
	}
	usageFile, _ := usageFiles(v2)
	var out []*snapshotResult
	for _, k := range snapshotKinds {
		r := &snapshotResult{kind: k}
		out = append(out, r)
		for i := range n {
			if err := snapshotOnce(ctx, gv, img, ks, filepath.Join(dir, fmt.Sprintf("checkpoint-%d-%d", len(out), i)), workspace, usageFile, v2, r); err != nil {
				return nil, fmt.Errorf("%s: %w", k.name, err)
			}
		}
	}
	return out, nil
}

func snapshotOnce(ctx context.Context, gv *ocidriver.Snapshotting, img sandbox.Image, ks sandbox.KernelSpec, dir string, workspace int64, usageFile string, v2 bool, r *snapshotResult) error {
	defer os.RemoveAll(dir)
	sb, err := gv.Create(ctx, sandbox.Spec{Image: img, Detached: true, Workspace: workspace, Labels: map[string]string{engine.LabelOwner: "bench-scaling-snapshot"}})
	if err != nil {
		return err
	}
	// Destroy is idempotent: after a Checkpoint it has nothing left to do.
	defer sb.Destroy(context.WithoutCancel(ctx))
	kern, err := sb.(sandbox.Kernels).StartKernel(ctx, ks)
	if err != nil {
		return fmt.Errorf("starting the python kernel: %w", err)
	}
	if res, err := kern.Run(ctx, sandbox.Cell{Code: r.kind.setup}); err != nil || res.Status != sandbox.CellOK {
		return fmt.Errorf("running %q: got %+v, %v", r.kind.setup, res, err)
	}
	cg := sandboxkit.Cgroup{V2: v2, Path: ocidriver.CgroupParent + "/" + sb.ID()}
	usage, err := readInt(filepath.Join(cg.MemoryDir(), usageFile))
	if err != nil {
		return fmt.Errorf("reading the sandbox's memory cgroup: %w", err)
	}
	start := time.Now()
	if err := gv.Checkpoint(ctx, sb, dir); err != nil {
		return err
	}
	r.checkpoint.Samples = append(r.checkpoint.Samples, time.Since(start))
	allocated, apparent, err := du(dir)
	if err != nil {
		return err
	}
	start = time.Now()
	restored, err := gv.Restore(ctx, dir, nil)
	if err != nil {
		return err
	}
	defer restored.Destroy(context.WithoutCancel(ctx))
	kernels, err := restored.(sandbox.Kernels).ListKernels(ctx)
	if err != nil || len(kernels) != 1 {
		return fmt.Errorf("the restored sandbox's kernels: got %v, %v; want one", kernels, err)
	}
	res, err := kernels[0].Run(ctx, sandbox.Cell{Code: r.kind.check})
	r.restored.Samples = append(r.restored.Samples, time.Since(start))
	if err != nil || res.Status != sandbox.CellOK || string(res.Stdout) != r.kind.out {
		return fmt.Errorf("the restored kernel's %q: got %+v, %v; want %q", r.kind.check, res, err, r.kind.out)
	}
	r.allocated, r.apparent, r.memory = append(r.allocated, allocated), append(r.apparent, apparent), append(r.memory, usage)
	return restored.Destroy(ctx)
}

// du sums what the tree at dir takes on disk: the blocks allocated to
// every entry (du's default, st_blocks of 512 bytes) and the apparent
// size of its regular files (du --apparent-size, st_size).
func du(dir string) (allocated, apparent int64, err error) {
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("no stat of %s", p)
		}
		allocated += st.Blocks * 512
		if fi.Mode().IsRegular() {
			apparent += fi.Size()
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("measuring the checkpoint %s: %w", dir, err)
	}
	return allocated, apparent, nil
}
