package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
)

// Checks of a template's finished tree, after harden: what harden
// guarantees for the runtime images must hold for a tree that packages,
// wheels and operator files went into too.

// pathDirs are the directories of a sandbox's PATH.
var pathDirs = []string{"usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin"}

// packageManagers are the package managers that must not be on a
// template's PATH (path.Match patterns). apt and dpkg stay, as in the
// runtime images: without root and network they install nothing.
var packageManagers = []string{"pip", "pip[0-9]*", "pipx", "easy_install*", "npm", "npx", "corepack", "yarn", "yarnpkg", "pnpm", "pnpx"}

// credentialPaths are where programs keep credentials (path.Match
// patterns); a template's image must have none.
var credentialPaths = []string{
	"root/.ssh", "root/.npmrc", "root/.pypirc", "root/.docker", "root/.aws", "root/.netrc",
	"root/.git-credentials", "root/.kube", "root/.config/gcloud", "root/.gnupg",
	"home/*/.ssh", "home/*/.npmrc", "home/*/.pypirc", "home/*/.docker", "home/*/.aws", "home/*/.netrc",
	"home/*/.git-credentials", "home/*/.kube", "home/*/.config/gcloud", "home/*/.gnupg",
}

// checkTree reports the first of a setuid or setgid file, a socket, a
// device, a FIFO, a package manager on PATH or a credentials file or
// directory in the tree at rootfs. File capabilities harden has removed.
func checkTree(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("opening %s: %w", rootfs, err)
	}
	defer root.Close()
	bad := func(what, p string) error {
		return errdefs.Publicf("the image would hold %s at /%s, which templates forbid (is it from debian_packages or files?): %w", what, p, errdefs.ErrInvalidArgument)
	}
	for _, dir := range pathDirs {
		for _, pm := range packageManagers {
			m, err := fs.Glob(root.FS(), path.Join(dir, pm))
			if err != nil {
				return err
			}
			if len(m) > 0 {
				return bad("a package manager", m[0])
			}
		}
	}
	for _, c := range credentialPaths {
		m, err := fs.Glob(root.FS(), c)
		if err != nil {
			return err
		}
		if len(m) > 0 {
			return bad("credentials", m[0])
		}
	}
	return fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walking /%s: %w", p, err)
		}
		switch t := d.Type(); {
		case t&fs.ModeSocket != 0:
			return bad("a socket", p)
		case t&fs.ModeCharDevice != 0:
			return bad("a character device", p)
		case t&fs.ModeDevice != 0:
			return bad("a block device", p)
		case t&fs.ModeNamedPipe != 0:
			return bad("a FIFO", p)
		case !t.IsRegular():
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("inspecting /%s: %w", p, err)
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			return bad("a setuid or setgid program", p)
		}
		return nil
	})
}

// Exit codes of the start check's programs: Start failed, Ready failed.
const (
	startFailed = 3
	readyFailed = 4
)

// startProgram is the program that runs a template's Start, then its
// Ready, with the base's interpreter (as the base's kernel would), and
// exits startFailed or readyFailed with the error on stderr.
func startProgram(base, start, ready string) []string {
	switch base {
	case "python":
		const code = `import sys, traceback
g = {"__name__": "__main__"}
for status, name, src in ((3, "<start>", sys.argv[1]), (4, "<ready>", sys.argv[2])):
    try:
        exec(compile(src, name, "exec"), g)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        sys.exit(status)
`
		return []string{"/usr/bin/python3", "-c", code, start, ready}
	case "node":
		const code = `for (const [status, src] of [[3, process.argv[1]], [4, process.argv[2]]]) {
  try { (0, eval)(src) } catch (e) { console.error(e instanceof Error ? e.name + ": " + e.message : String(e)); process.exit(status) }
}`
		return []string{"/usr/bin/node", "-e", code, start, ready}
	}
	return []string{"/bin/busybox", "sh", "-c", `eval "$1" || exit 3; eval "$2" || exit 4`, "sh", start, ready}
}

// startCheck runs the template's Start and Ready in a build sandbox over
// the finished tree, read-only, as the sandbox's user, without network,
// with the template's environment and working directory. A failure is an
// error naming start or ready, with the last lines of the output.
func (b *templateBuild) startCheck(ctx context.Context, rootfs string) error {
	if strings.TrimSpace(b.t.Start) == "" && strings.TrimSpace(b.t.Ready) == "" {
		return nil
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp", "LANG=C.UTF-8"}
	for _, k := range slices.Sorted(maps.Keys(b.t.Env)) {
		env = append(env, k+"="+b.t.Env[k])
	}
	cwd := b.t.Workdir
	if cwd == "" {
		cwd = "/tmp"
	}
	tail := &tailWriter{max: 16 << 10}
	var out io.Writer = tail
	if b.opts.Log != nil {
		out = io.MultiWriter(b.opts.Log, tail)
	}
	box := b.box(rootfs, false)
	box.User = 65534
	box.Args = startProgram(b.t.Base, b.t.Start, b.t.Ready)
	box.Env = env
	box.Cwd = cwd
	box.Timeout = startTimeout
	box.Memory = 4 << 30
	box.Out = out
	err := box.run(ctx)
	var ee *exitError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return err
	case errors.Is(err, errBoxTimeout):
		return errdefs.Publicf("start: start and ready did not finish within %v: %w", startTimeout, errdefs.ErrInvalidArgument)
	case errors.As(err, &ee) && ee.code == readyFailed:
		return errdefs.Publicf("ready: the check failed after start: %s: %w", tail.lastLines(5), errdefs.ErrInvalidArgument)
	case errors.As(err, &ee):
		return errdefs.Publicf("start: it failed (exit status %d): %s: %w", ee.code, tail.lastLines(5), errdefs.ErrInvalidArgument)
	}
	return err
}
