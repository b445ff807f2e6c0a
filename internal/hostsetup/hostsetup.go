// Package hostsetup installs or verifies what a Stockade host needs: Debian's
// runc and debootstrap, a static runsc at the pinned gVisor version, and the
// runtime images. Every step checks before it acts, so a second run on a
// ready host does no work.
package hostsetup

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
)

// Options configure Run.
type Options struct {
	// DataDir is the image store root.
	DataDir string
	// RunscDir is where the runsc build is kept; /usr/local/bin/runsc links
	// to it. Empty means /usr/local/lib/stockade.
	RunscDir string
	// Images are the runtimes to build; nil means all.
	Images []string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// aptPackages are the Debian packages a host needs, by the binary each provides.
var aptPackages = map[string]string{
	"/usr/sbin/runc":        "runc",
	"/usr/sbin/debootstrap": "debootstrap",
	// curl is what the README's API session and `make up` use.
	"/usr/bin/curl": "curl",
}

// Run performs the setup. It needs root.
func Run(ctx context.Context, o Options) error {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.RunscDir == "" {
		o.RunscDir = "/usr/local/lib/stockade"
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("setup must run as root: %w", errdefs.ErrPermissionDenied)
	}
	if err := installPackages(ctx, o.Log); err != nil {
		return err
	}
	if err := installRunsc(ctx, o.RunscDir, o.Log); err != nil {
		return err
	}
	store := image.Open(o.DataDir)
	names := o.Images
	if names == nil {
		names = []string{"python", "node", "shell"}
	}
	for _, n := range names {
		m, err := store.Build(ctx, n, image.BuildOptions{Log: o.Log})
		if err != nil {
			return fmt.Errorf("building image %q: %w", n, err)
		}
		fmt.Fprintf(o.Log, "image %s: %s\n", n, m.Digest)
	}
	return nil
}

func installPackages(ctx context.Context, log io.Writer) error {
	var missing []string
	for bin, pkg := range aptPackages {
		if _, err := os.Stat(bin); err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		fmt.Fprintln(log, "runc, debootstrap and curl: present")
		return nil
	}
	fmt.Fprintf(log, "installing %s with apt-get\n", strings.Join(missing, " "))
	if err := runLogged(ctx, log, nil, "apt-get", "update", "-q"); err != nil {
		return fmt.Errorf("apt-get update: %w", err)
	}
	args := append([]string{"install", "-y", "-q", "--no-install-recommends"}, missing...)
	if err := runLogged(ctx, log, []string{"DEBIAN_FRONTEND=noninteractive"}, "apt-get", args...); err != nil {
		return fmt.Errorf("installing %s: %w", strings.Join(missing, " "), err)
	}
	return nil
}

// RunscPath is where setup installs the pinned runsc build.
func RunscPath(dir string) string { return filepath.Join(dir, "runsc-"+gvisor.Version) }

// installRunsc builds runsc static at the pinned version unless that build
// is present, and links /usr/local/bin/runsc to it.
func installRunsc(ctx context.Context, dir string, log io.Writer) error {
	target := RunscPath(dir)
	if err := checkStatic(target); err == nil {
		fmt.Fprintf(log, "runsc %s: present\n", gvisor.Version)
		return linkRunsc(target)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		if _, serr := os.Stat("/usr/local/go/bin/go"); serr != nil {
			return fmt.Errorf("building runsc needs the Go toolchain (not found on PATH or in /usr/local/go): %w", errdefs.ErrFailedPrecondition)
		}
		goBin = "/usr/local/go/bin/go"
	}
	fmt.Fprintf(log, "building runsc %s (static; takes a few minutes)\n", gvisor.Version)
	tmp, err := os.MkdirTemp("", "stockade-runsc-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	env := []string{"CGO_ENABLED=0", "GOBIN=" + tmp, "GOFLAGS=-buildvcs=false"}
	if err := runLogged(ctx, log, env, goBin, "install", "gvisor.dev/gvisor/runsc@"+gvisor.Version); err != nil {
		return fmt.Errorf("building runsc: %w", err)
	}
	built := filepath.Join(tmp, "runsc")
	if err := checkStatic(built); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := copyFile(built, target+".tmp", 0o755); err != nil {
		return err
	}
	if err := os.Rename(target+".tmp", target); err != nil {
		return err
	}
	return linkRunsc(target)
}

// checkStatic verifies that path is an executable without a dynamic loader.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("runsc at %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("runsc at %s is dynamically linked; it must be built with CGO_ENABLED=0: %w", path, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

func linkRunsc(target string) error {
	const link = "/usr/local/bin/runsc"
	if cur, err := os.Readlink(link); err == nil && cur == target {
		return nil
	}
	tmp := link + ".stockade-tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("linking runsc: %w", err)
	}
	return os.Rename(tmp, link)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// runLogged runs a command with its output sent to log.
func runLogged(ctx context.Context, log io.Writer, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}
