package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
)

// buildBox is one run of a program of a template build (package
// maintainer scripts, npm install scripts, the start check) in a gVisor
// sandbox of its own: its own pid, mount, ipc, uts and network namespaces,
// no network at all, no host path but the tree it works on and its inputs
// (read-only), a pids and a memory limit, and a timeout.
//
// The bundle is written by hand rather than by internal/oci, whose profile
// is the runtime sandboxes': a read-only shared image, the unprivileged
// user and no capabilities. A build must write the tree (dpkg unpacks
// into it) as root with root's file capabilities (chown, fowner, setuid
// for maintainer scripts that add users), which that profile forbids on
// purpose. What keeps it in is gVisor: the programs talk to the Sentry,
// never to the host kernel, and the Sentry sees only the bundle's mounts.
type buildBox struct {
	// Runsc is the runsc executable; empty means "runsc" on PATH.
	Runsc string
	// StateDir is where the run keeps runsc's state and its bundle, in a
	// directory of its own removed after the run; empty means the
	// system's temporary directory.
	StateDir string
	// Rootfs is the absolute host path of the tree the program runs in.
	Rootfs string
	// Writable lets the program change Rootfs; otherwise it is read-only.
	Writable bool
	// Inputs are host paths bind-mounted read-only, by their path inside
	// the sandbox. In a read-only root their mount points must exist.
	Inputs map[string]string
	// User is the uid and gid the program runs as: 0 (root, with the
	// capabilities of buildCaps) or an unprivileged one, without any.
	User uint32
	// Args, Env and Cwd are the program's; Cwd empty means "/".
	Args []string
	Env  []string
	Cwd  string
	// Timeout bounds the run; zero means ten minutes.
	Timeout time.Duration
	// Memory (bytes) and Pids bound the sandbox; zero means 2 GiB and 512.
	Memory, Pids int64
	// Out receives the program's stdout and stderr; nil discards them.
	Out io.Writer
}

// buildCaps are the capabilities of a build's root: what dpkg and
// maintainer scripts need to lay out a tree owned by several users, and
// nothing that reaches beyond it.
var buildCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_SETUID", "CAP_SETGID", "CAP_KILL"}

// errBoxTimeout is the error of a run that ran out of time.
var errBoxTimeout = errors.New("timed out")

// exitError is a run whose program exited non-zero.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exited with status %d", e.code) }

// run runs the program and waits for it. A program that exits non-zero is
// an *exitError, one that runs out of time errBoxTimeout; ctx's
// cancellation kills the sandbox and returns ctx's error. The sandbox, its
// state and its cgroup are gone when run returns.
func (b buildBox) run(ctx context.Context) (err error) {
	if b.Runsc == "" {
		b.Runsc = config.DefaultRunsc
	}
	runsc, err := exec.LookPath(b.Runsc)
	if err != nil {
		return fmt.Errorf("runsc not found (%v); build it with `stockade setup`: %w", err, errdefs.ErrFailedPrecondition)
	}
	if b.StateDir == "" {
		b.StateDir = os.TempDir()
	}
	if b.Timeout == 0 {
		b.Timeout = 10 * time.Minute
	}
	if b.Memory == 0 {
		b.Memory = 2 << 30
	}
	if b.Pids == 0 {
		b.Pids = 512
	}
	var idb [8]byte
	rand.Read(idb[:])
	id := "build-" + hex.EncodeToString(idb[:])
	if err := os.MkdirAll(b.StateDir, fsmode.Dir); err != nil {
		return fmt.Errorf("creating build sandbox state: %w", classify(err))
	}
	dir, err := os.MkdirTemp(b.StateDir, id+"-")
	if err != nil {
		return fmt.Errorf("creating build sandbox state: %w", classify(err))
	}
	cg := sandboxkit.Cgroup{V2: cgroupV2(), Path: "/stockade/" + id}
	defer func() {
		for _, d := range cg.Dirs() {
			os.Remove(d) // runsc removes it; this is for a runsc that died
		}
		os.RemoveAll(dir)
	}()
	spec := b.spec(cg.Path)
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encoding build sandbox bundle: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, fsmode.File); err != nil {
		return fmt.Errorf("writing build sandbox bundle: %w", classify(err))
	}
	state := filepath.Join(dir, "state")
	global := []string{"--root", state, "--network=none", "--overlay2=none", "--host-uds=none", "--platform=systrap"}
	runCtx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, runsc, append(global, "run", "--bundle", dir, id)...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	out := b.Out
	if out == nil {
		out = io.Discard
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	kill := func() {
		k := exec.Command(runsc, append(global, "delete", "--force", id)...)
		k.Stdout, k.Stderr = io.Discard, io.Discard
		_ = k.Run()
	}
	cmd.Cancel = func() error {
		kill()
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 10 * time.Second
	err = cmd.Run()
	kill() // a sandbox whose runsc died must not outlive the run
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case runCtx.Err() != nil:
		return errBoxTimeout
	case err == nil:
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() > 0 {
		return &exitError{code: ee.ExitCode()}
	}
	return fmt.Errorf("running the build sandbox: %w", err)
}

// spec is the bundle's configuration.
func (b buildBox) spec(cgroupsPath string) *specs.Spec {
	cwd := b.Cwd
	if cwd == "" {
		cwd = "/"
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
	}
	if !b.Writable {
		mounts = append(mounts, specs.Mount{Destination: "/workspace", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}})
	}
	for _, target := range slices.Sorted(maps.Keys(b.Inputs)) {
		mounts = append(mounts, specs.Mount{Destination: target, Type: "bind", Source: b.Inputs[target],
			Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	// The host's pids cgroup also counts the Sentry's own threads.
	memory, pids := b.Memory, b.Pids+256
	caps := &specs.LinuxCapabilities{Bounding: buildCaps, Effective: buildCaps, Permitted: buildCaps}
	if b.User != 0 {
		caps = &specs.LinuxCapabilities{}
	}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User:            specs.User{UID: b.User, GID: b.User},
			Args:            b.Args,
			Env:             b.Env,
			Cwd:             cwd,
			Capabilities:    caps,
			NoNewPrivileges: true,
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 4096, Soft: 4096}},
		},
		Root:     &specs.Root{Path: b.Rootfs, Readonly: !b.Writable},
		Hostname: "build",
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace},
			},
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &memory, Swap: &memory},
				Pids:   &specs.LinuxPids{Limit: pids},
			},
			CgroupsPath: cgroupsPath,
		},
	}
}

// cgroupV2 reports whether the host uses the unified cgroup hierarchy.
func cgroupV2() bool {
	var st unix.Statfs_t
	if err := unix.Statfs(sandboxkit.CgroupRoot, &st); err != nil {
		return false
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC
}
