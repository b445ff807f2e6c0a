package ocidriver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
)

// A checkpoint restores only into the runtime build that made it: gVisor's
// image format is that build's own, and another build's Sentry panics
// reading it. So the record of a checkpoint names the build that made it
// (snapshotRecord.Runtime), and Restore refuses, before starting anything,
// one that another build made (ErrFailedPrecondition naming both).
//
// A build is named by the first line of `<runtime> --version` and the
// SHA-256 of its executable: runsc built from source (go install) says
// "VERSION_MISSING" whatever its commit, so the version alone names
// nothing. The digest is taken once per executable file: buildCache keeps
// it by the file's identity (device, inode, size, modification and change
// times), so that a runtime replaced under a running daemon is noticed at
// the next checkpoint or restore (one stat), not hashed on each.
type buildCache struct {
	mu    sync.Mutex
	path  string
	stamp buildStamp
	name  string
}

// buildStamp is what identifies an executable file's content without
// reading it.
type buildStamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime time.Time
}

// RuntimeBuild names the runtime build this driver runs (see buildCache):
// "<version line> sha256:<hex>". The engine keys the checkpoints it
// keeps (golden, pools') by it, so that another build makes its own.
func (d *Snapshotting) RuntimeBuild(ctx context.Context) (string, error) {
	binary, err := exec.LookPath(d.cfg.Binary)
	if err != nil {
		return "", d.missingBinary(err)
	}
	return d.builds.build(ctx, binary)
}

// build names the build of the executable at binary.
func (c *buildCache) build(ctx context.Context, binary string) (string, error) {
	st, err := stampOf(binary)
	if err != nil {
		return "", fmt.Errorf("naming the runtime build: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.path == binary && c.stamp == st && c.name != "" {
		return c.name, nil
	}
	f, err := os.Open(binary)
	if err != nil {
		return "", fmt.Errorf("naming the runtime build: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("naming the runtime build: %w", err)
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(vctx, binary, "--version")
	cmd.Env = runtimeEnv
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("naming the runtime build: %s --version: %v: %w", binary, err, errdefs.ErrUnavailable)
	}
	version, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	build := sandboxkit.OneLine(version) + " sha256:" + hex.EncodeToString(h.Sum(nil))
	// The file may have changed while it was read: keep the name only
	// when its stamp held.
	if after, err := stampOf(binary); err == nil && after == st {
		c.path, c.stamp, c.name = binary, st, build
	}
	return build, nil
}

// stampOf is the identity of the file at path (buildStamp).
func stampOf(path string) (buildStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return buildStamp{}, err
	}
	st := buildStamp{size: fi.Size(), mtime: fi.ModTime()}
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.dev, st.ino = uint64(s.Dev), s.Ino
		st.ctime = time.Unix(s.Ctim.Sec, s.Ctim.Nsec)
	}
	return st, nil
}

// checkBuild refuses a checkpoint that the runtime build now is not the
// one of (made, from its record). The message names both builds and no
// path: a paused session's owner reads it when its resume is refused.
func checkBuild(made, now string) error {
	if made == now {
		return nil
	}
	by := fmt.Sprintf("runtime build %q", made)
	if made == "" {
		by = "a runtime build it does not name (an older release of this server)"
	}
	return errdefs.Publicf("the checkpoint was made by %s and this server runs build %q, which cannot restore another build's checkpoint; "+
		"it restores once that build is installed again: %w", by, now, errdefs.ErrFailedPrecondition)
}
