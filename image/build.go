package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/fsmode"
)

// Suite is the Debian release every image is built from.
const Suite = "trixie"

// BuildOptions tune Build. The zero value builds only a missing or damaged
// image, from config.DefaultMirror, without output.
type BuildOptions struct {
	// Force rebuilds even when a valid image exists.
	Force bool
	// Mirror is the Debian mirror's URL; empty means config.DefaultMirror.
	Mirror string
	// Log receives debootstrap's output as it runs; nil discards it.
	Log io.Writer
	// Progress, if set, is called as the build moves on: at each stage and
	// package, and with the tree's size every few seconds. Calls come one
	// at a time, from goroutines of Build.
	Progress func(Progress)
}

// debootstrapEnv is debootstrap's whole environment: nothing is inherited
// from the calling process, so that builds on different hosts agree.
// PYTHONHASHSEED makes the bytecode that package scripts compile
// reproducible.
var debootstrapEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LC_ALL=C",
	"DEBIAN_FRONTEND=noninteractive",
	"PYTHONHASHSEED=0",
}

// Build makes sure the image of the runtime name exists and returns its
// manifest. If a valid image built from the runtime's current definition
// exists (see Current) and opts.Force is false, Build returns at once (it
// only reads two files); an image of an older definition (a package added
// to the runtime, say) is rebuilt. Otherwise it runs debootstrap into a
// temporary directory, hardens the tree, hashes it and publishes it with
// renames: first the image directory, then the ref. If Build fails or ctx is
// cancelled, it removes everything it created and leaves the ref as it was.
//
// One Build runs at a time per store; a second waits for the first (until
// its ctx is done) and then returns the image the first built. Building needs
// root and network access to the mirror; the first build of a runtime takes
// minutes, later ones reuse the downloaded packages under <root>/cache/debs.
//
// An image replaced by a forced rebuild stays on disk, since sandboxes may
// still run from it, until Prune removes it.
func (s *Store) Build(ctx context.Context, name string, opts BuildOptions) (Manifest, error) {
	rt, err := runtimeFor(name)
	if err != nil {
		return Manifest{}, err
	}
	if opts.Mirror == "" {
		opts.Mirror = config.DefaultMirror
	}
	if err := checkMirror(opts.Mirror); err != nil {
		return Manifest{}, err
	}
	if !opts.Force {
		if m, err := s.Current(name); err == nil {
			return m, nil
		}
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return Manifest{}, err
	}
	defer unlock()
	if !opts.Force {
		// Another process may have built it while we waited for the lock.
		if m, err := s.Current(name); err == nil {
			return m, nil
		}
	}
	if err := s.cleanTmp(); err != nil {
		return Manifest{}, err
	}
	m, err := s.build(ctx, rt, opts)
	if err != nil {
		return Manifest{}, fmt.Errorf("building image %q: %w", name, err)
	}
	return m, nil
}

// build does the work of Build; the caller holds the lock.
func (s *Store) build(ctx context.Context, rt Runtime, opts BuildOptions) (_ Manifest, err error) {
	tmp, err := os.MkdirTemp(s.tmpDir(), rt.Name+"-")
	if err != nil {
		return Manifest{}, fmt.Errorf("creating build directory: %w", classify(err))
	}
	defer func() {
		if rerr := removeTree(tmp); rerr != nil && err == nil {
			err = fmt.Errorf("cleaning up build directory: %w", classify(rerr))
		}
	}()
	// The image directory is made of tmp by a rename; sandboxes in a user
	// namespace must be able to traverse it.
	if err := os.Chmod(tmp, fsmode.Traverse); err != nil {
		return Manifest{}, fmt.Errorf("creating build directory: %w", classify(err))
	}
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Manifest{}, fmt.Errorf("creating build directory: %w", classify(err))
	}

	prog := newProgress(opts.Progress, rt.Name)
	if err := s.bootstrapWatched(ctx, rootfs, rt, opts, prog); err != nil {
		return Manifest{}, err
	}
	if err := ctx.Err(); err != nil {
		return Manifest{}, err
	}
	prog.stage("hardening")
	if err := harden(rootfs, rt); err != nil {
		return Manifest{}, fmt.Errorf("hardening the tree: %w", classify(err))
	}
	pkgs, err := treePackages(rootfs)
	if err != nil {
		return Manifest{}, err
	}
	for _, p := range rt.Packages {
		if _, ok := pkgs[p]; !ok {
			return Manifest{}, fmt.Errorf("package %s is not installed in the tree: %w", p, errdefs.ErrFailedPrecondition)
		}
	}
	prog.stage("hashing")
	sum, err := treeDigest(ctx, rootfs)
	if err != nil {
		if ctx.Err() != nil {
			return Manifest{}, ctx.Err()
		}
		return Manifest{}, classify(err)
	}
	prog.size(sum.size)
	m := Manifest{
		Name:         rt.Name,
		Digest:       "sha256:" + sum.hex,
		DigestFormat: digestFormat,
		Created:      time.Now().UTC().Truncate(time.Second),
		Suite:        Suite,
		Mirror:       opts.Mirror,
		Packages:     pkgs,
		Interpreter:  rt.Interpreter,
		Definition:   rt.definition(),
		SizeBytes:    sum.size,
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, fmt.Errorf("encoding manifest: %w", err)
	}
	if err := writeFileSync(filepath.Join(tmp, "manifest.json"), append(data, '\n'), fsmode.File); err != nil {
		return Manifest{}, fmt.Errorf("writing manifest: %w", classify(err))
	}
	if existing, err := s.checkImage(sum.hex, rt); err == nil {
		// This very tree is already in the store. Keep it, since sandboxes
		// may run from it, but only if its content still matches its name.
		if old, err := treeDigest(ctx, filepath.Join(s.imageDir(sum.hex), "rootfs")); err == nil && old.hex == sum.hex {
			if existing.Definition == m.Definition {
				return existing, s.writeRef(rt.Name, existing.Digest)
			}
			// The tree of an older definition is today's too: its
			// manifest now records today's definition, or every Build
			// would build it again.
			if err := writeFileAtomic(s.imageDir(sum.hex), "manifest.json", append(data, '\n'), fsmode.File); err != nil {
				return Manifest{}, fmt.Errorf("writing manifest: %w", classify(err))
			}
			return m, s.writeRef(rt.Name, m.Digest)
		}
	}
	if err := s.publish(ctx, tmp, sum.hex); err != nil {
		return Manifest{}, err
	}
	return m, s.writeRef(rt.Name, m.Digest)
}

// bootstrapWatched runs the bootstrap with its output read by prog, and
// the tree's size measured while it runs.
func (s *Store) bootstrapWatched(ctx context.Context, rootfs string, rt Runtime, opts BuildOptions, prog *progress) error {
	if opts.Progress == nil {
		return s.bootstrap(ctx, rootfs, rt, opts)
	}
	if opts.Log == nil {
		opts.Log = prog
	} else {
		opts.Log = io.MultiWriter(opts.Log, prog)
	}
	measuring, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { prog.measure(measuring, rootfs) })
	defer wg.Wait()
	defer stop()
	return s.bootstrap(ctx, rootfs, rt, opts)
}

// publish makes the finished build directory tmp the image hex, replacing a
// damaged image of that digest.
func (s *Store) publish(ctx context.Context, tmp, hex string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Flush the tree before it becomes visible: after a power loss, an
	// image must be either absent or complete.
	syscall.Sync()
	final := s.imageDir(hex)
	if _, err := os.Lstat(final); err == nil {
		if err := s.discard(final); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("publishing image: %w", classify(err))
	}
	return syncDir(s.blobsDir())
}

// writeRef points the ref of name at digest.
func (s *Store) writeRef(name, digest string) error {
	if err := writeFileAtomic(s.refsDir(), name, []byte(digest+"\n"), fsmode.File); err != nil {
		return fmt.Errorf("writing ref of image %q: %w", name, classify(err))
	}
	return nil
}

// cleanTmp removes what earlier builds left in the store when their process
// died: build directories, trash and temporary ref files. The caller holds
// the lock, so none of them is in use.
func (s *Store) cleanTmp() error {
	ents, err := os.ReadDir(s.tmpDir())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("listing %s: %w", s.tmpDir(), classify(err))
	}
	for _, e := range ents {
		if err := removeTree(filepath.Join(s.tmpDir(), e.Name())); err != nil {
			return fmt.Errorf("removing a stale build: %w", classify(err))
		}
	}
	for _, dir := range []string{s.refsDir(), s.templateRefsDir()} {
		refs, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("listing %s: %w", dir, classify(err))
		}
		for _, e := range refs {
			if strings.HasPrefix(e.Name(), ".") {
				if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("removing a stale ref: %w", classify(err))
				}
			}
		}
	}
	return nil
}

// checkMirror rejects a mirror that is not an absolute http, https or file
// URL, so that it cannot be mistaken for an option of debootstrap.
func checkMirror(mirror string) error {
	u, err := url.Parse(mirror)
	if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		return nil
	}
	if err == nil && u.Scheme == "file" && strings.HasPrefix(u.Path, "/") {
		return nil
	}
	return fmt.Errorf("mirror %q is not an http, https or file URL: %w", mirror, errdefs.ErrInvalidArgument)
}

// debootstrap is the default bootstrap: it runs debootstrap for Suite with
// the minbase variant plus rt's packages, sharing the store's package cache.
// On cancellation it kills debootstrap and everything it started.
func (s *Store) debootstrap(ctx context.Context, rootfs string, rt Runtime, opts BuildOptions) error {
	if _, err := os.Stat(s.debootstrapPath); err != nil {
		return fmt.Errorf("debootstrap not found at %s; install it with \"apt-get install debootstrap\": %w", s.debootstrapPath, errdefs.ErrFailedPrecondition)
	}
	if err := os.MkdirAll(s.cacheDir(), fsmode.Dir); err != nil {
		return fmt.Errorf("creating package cache: %w", classify(err))
	}
	cmd := exec.CommandContext(ctx, s.debootstrapPath,
		"--variant=minbase",
		"--include="+strings.Join(rt.Packages, ","),
		"--cache-dir="+s.cacheDir(),
		Suite, rootfs, opts.Mirror)
	cmd.Dir = "/"
	cmd.Env = debootstrapEnv
	tail := &tailWriter{max: 8 << 10}
	var out io.Writer = tail
	if opts.Log != nil {
		out = io.MultiWriter(opts.Log, tail)
	}
	cmd.Stdout, cmd.Stderr = out, out
	// debootstrap runs dpkg and maintainer scripts in the target; kill the
	// whole process group on cancellation, and debootstrap itself if we die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		return fmt.Errorf("running debootstrap: %w", ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("running debootstrap: %v; last output: %s: %w", err, tail.lastLines(4), errdefs.ErrUnavailable)
	}
	return nil
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	max int
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	if len(w.buf) > w.max {
		w.buf = append(w.buf[:0], w.buf[len(w.buf)-w.max:]...)
	}
	return len(p), nil
}

// String returns what the writer keeps.
func (w *tailWriter) String() string { return string(w.buf) }

// lastLines returns the last n non-empty lines written, joined by " | ".
func (w *tailWriter) lastLines(n int) string {
	var lines []string
	for _, l := range strings.Split(string(w.buf), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 0 {
		return "(none)"
	}
	return strings.Join(lines, " | ")
}
