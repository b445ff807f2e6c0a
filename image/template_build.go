package image

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/dataroot"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/templates"
)

const (
	// templateRevision stands for how a template's image is made beyond
	// its inputs; bump it when that changes, so that every template is
	// rebuilt.
	templateRevision = 1
	// startTimeout bounds the start check.
	startTimeout = 60 * time.Second
	// templateInfoPath is the file in a template's image that records
	// what a sandbox of it runs with, so that two templates, or two
	// declarations of one, never share an image (and a manifest).
	templateInfoPath = "etc/stockade/template.json"
)

// templateBuild is one build of a template.
type templateBuild struct {
	s      *Store
	t      templates.Template
	rt     Runtime
	opts   TemplateOptions
	mirror string
	prog   *progress

	base  Manifest    // the base runtime's current image
	key   string      // see TemplateManifest.Key
	files []fileInput // the operator's files, hashed by computeKey
}

// fileInput is one file or directory of a template's files.
type fileInput struct {
	src    string // the host path, for messages
	rel    string // the path relative to the data root, to read it by
	target string
	dir    bool
	sum    string // hex SHA-256 of a file's content
}

// computeKey returns the build's key (TemplateManifest.Key) over the
// current base image base. It hashes the operator's files (once per
// build) and wheelhouse wheels.
func (b *templateBuild) computeKey(base Manifest) (string, error) {
	if b.files == nil {
		files, err := hashFiles(b.opts.Sources.DataRoot, b.t.Files)
		if err != nil {
			return "", err
		}
		b.files = files
	}
	h := sha256.New()
	canon := templates.Canonical(b.t)
	fmt.Fprintf(h, "template %d\nhardening %s\nbase %q\n", templateRevision, templateRuntime(b.rt).definition(), base.Digest)
	binary.Write(h, binary.BigEndian, uint64(len(canon)))
	h.Write(canon)
	if len(b.t.DebianPackages) > 0 {
		fmt.Fprintf(h, "mirror %q\n", b.mirror)
	}
	if len(b.t.NPMPackages) > 0 {
		fmt.Fprintf(h, "npm registry %q\n", b.opts.Sources.NPMRegistry)
	}
	for _, w := range b.t.PythonWheels {
		if w.Name != "" {
			fmt.Fprintf(h, "wheel %q from index %q\n", w.Name, b.opts.Sources.PythonIndex)
			continue
		}
		sum, err := pathSum(filepath.Join(b.opts.Sources.Wheelhouse, filepath.Base(w.File)))
		if err != nil {
			sum = "missing" // the build reports it
		}
		fmt.Fprintf(h, "wheel %q %s\n", w.File, sum)
	}
	for _, f := range b.files {
		fmt.Fprintf(h, "file %q %t %s\n", f.target, f.dir, f.sum)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// hashFiles walks the sources of files (a file or a directory each) and
// hashes their contents, reading them through the data root dataRoot
// (openDataRoot): each source must still resolve, its symlinks followed,
// to a path under it, and is then walked and read by its path relative to
// the root, so that no link swapped in since (a parent directory made a
// symlink) leads the build out of it. Symbolic links and special files
// below a source are refused: what is copied is what the operator's paths
// hold, nothing they point to.
func hashFiles(dataRoot string, files []templates.File) ([]fileInput, error) {
	out := []fileInput{}
	if len(files) == 0 {
		return out, nil
	}
	root, _, err := openDataRoot(dataRoot)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	for _, f := range files {
		if err := checkTarget(f.Target); err != nil {
			return nil, err
		}
		rel, err := sourceRel(dataRoot, f.Source)
		if err != nil {
			return nil, err
		}
		got, err := hashSource(root, rel, f)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

// hashSource walks the source f, at rel in the data root root.
func hashSource(root *os.Root, rel string, f templates.File) ([]fileInput, error) {
	var out []fileInput
	err := fs.WalkDir(root.FS(), rel, func(p string, d fs.DirEntry, err error) error {
		sub, _ := filepath.Rel(rel, p)
		shown := filepath.Join(f.Source, sub)
		if err != nil {
			return fmt.Errorf("%s: %w", shown, unwrapPath(err))
		}
		target := path.Join(f.Target, filepath.ToSlash(sub))
		switch {
		case d.IsDir():
			out = append(out, fileInput{src: shown, rel: p, target: target, dir: true})
		case d.Type().IsRegular():
			sum, err := fileSum(root, p)
			if err != nil {
				return fmt.Errorf("%s: %w", shown, unwrapPath(err))
			}
			out = append(out, fileInput{src: shown, rel: p, target: target, sum: sum})
		default:
			return fmt.Errorf("%s is a %v, not a file or directory", shown, d.Type())
		}
		return nil
	})
	if err != nil {
		return nil, errdefs.Publicf("files: %q: %s: %w", f.Source, err.Error(), errdefs.ErrInvalidArgument)
	}
	return out, nil
}

// openDataRoot opens the data root dir, its symlinks resolved, and
// returns it with its resolved path, after checking it again as the
// declaration's files were checked when it was loaded (internal/dataroot:
// absolute, not the host's root, no home, credentials or system
// directory).
func openDataRoot(dir string) (*os.Root, string, error) {
	r := dataroot.Resolve(dir)
	if err := r.Err(); err != nil {
		return nil, "", errdefs.Publicf("files: %s: %w", err.Error(), errdefs.ErrFailedPrecondition)
	}
	root, err := os.OpenRoot(r.Resolved())
	if err != nil {
		return nil, "", errdefs.Publicf("files: the data root %s cannot be opened: %v: %w", dir, unwrapPath(err), errdefs.ErrFailedPrecondition)
	}
	return root, r.Resolved(), nil
}

// sourceRel returns the path, relative to the resolved data root, of the
// file source src, checked again now as templates.Validate checked it
// (dataroot.CheckFile): under the data root, no symlink in it, no
// credentials directory, special file or link in a directory source.
func sourceRel(dataRoot, src string) (string, error) {
	s, err := dataroot.CheckFile(dataRoot, src)
	if err != nil {
		return "", errdefs.Publicf("files: %s: %w", err.Error(), errdefs.ErrInvalidArgument)
	}
	return filepath.ToSlash(s.Rel), nil
}

// unwrapPath is err without a PathError's operation and path, which
// messages name their own way.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// forbiddenTargets are where no operator file may go: the sandbox's
// mount points and scratch directories, and what the build writes.
var forbiddenTargets = []string{"/tmp", "/workspace", "/proc", "/sys", "/dev", "/run", "/.stockade", "/data", "/etc/stockade"}

// checkTarget refuses a file's target that is not an absolute path below
// "/" outside forbiddenTargets. templates.Validate says so too; the build
// does not rely on it.
func checkTarget(target string) error {
	clean := path.Clean(target)
	if !path.IsAbs(target) || clean == "/" || clean != target {
		return errdefs.Publicf("files: target %q is not a clean absolute path below /: %w", target, errdefs.ErrInvalidArgument)
	}
	for _, d := range forbiddenTargets {
		if within(clean, d) {
			return errdefs.Publicf("files: target %q is under %s, which the sandbox mounts over or the build writes: %w", target, d, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// fileSum is the hex SHA-256 of the regular file name in root.
func fileSum(root *os.Root, name string) (string, error) {
	f, err := openRegular(root, name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// pathSum is the hex SHA-256 of the regular file at p, which must not be
// a link.
func pathSum(p string) (string, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", errors.New("not a regular file")
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// openRegular opens name in root for reading, which must be a regular
// file: O_NONBLOCK, so that a FIFO put there does not block the open.
func openRegular(root *os.Root, name string) (*os.File, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, errors.New("not a regular file")
	}
	return f, nil
}

// build does the work of BuildTemplate; the caller holds the lock and has
// run cached (b.base, b.key).
func (b *templateBuild) build(ctx context.Context) (_ Manifest, err error) {
	s := b.s
	tmp, err := os.MkdirTemp(s.tmpDir(), "template-"+b.t.Name+"-")
	if err != nil {
		return Manifest{}, fmt.Errorf("creating build directory: %w", classify(err))
	}
	defer func() {
		if rerr := removeTree(tmp); rerr != nil && err == nil {
			err = fmt.Errorf("cleaning up build directory: %w", classify(rerr))
		}
		if err != nil && !errdefs.IsResourceExhausted(err) && isNoSpaceErr(err) {
			err = noSpace(s)
		}
	}()
	if err := os.Chmod(tmp, fsmode.Traverse); err != nil {
		return Manifest{}, fmt.Errorf("creating build directory: %w", classify(err))
	}
	baseRootfs := filepath.Join(s.imageDir(strings.TrimPrefix(b.base.Digest, "sha256:")), "rootfs")
	src, layer := baseRootfs, ""
	if len(b.t.DebianPackages) > 0 {
		if layer, src, err = s.debianLayer(ctx, b, b.base.Digest, baseRootfs); err != nil {
			return Manifest{}, err
		}
	}
	rootfs := filepath.Join(tmp, "rootfs")
	if err := copyTree(ctx, src, rootfs); err != nil {
		return Manifest{}, err
	}
	tm := &TemplateManifest{Name: b.t.Name, Base: b.t.Base, Key: b.key, Layer: layer,
		Env: b.t.Env, Workdir: b.t.Workdir, Start: b.t.Start, Ready: b.t.Ready, Golden: b.t.Golden}
	tm.Declaration = templates.Key(b.t)
	if len(b.t.PythonWheels) > 0 {
		b.prog.stage("wheels")
		if tm.Wheels, err = b.installWheels(ctx, rootfs); err != nil {
			return Manifest{}, err
		}
	}
	if len(b.t.NPMPackages) > 0 {
		b.prog.stage("npm")
		if tm.NPM, err = b.installNPM(ctx, rootfs); err != nil {
			return Manifest{}, err
		}
	}
	b.prog.stage("files")
	if tm.Files, err = b.copyFiles(rootfs, tm); err != nil {
		return Manifest{}, err
	}
	if err := ctx.Err(); err != nil {
		return Manifest{}, err
	}
	b.prog.stage("hardening")
	if err := harden(rootfs, templateRuntime(b.rt)); err != nil {
		return Manifest{}, fmt.Errorf("hardening the tree: %w", classify(err))
	}
	b.prog.stage("checking")
	if err := checkTree(rootfs); err != nil {
		return Manifest{}, err
	}
	if err := b.startCheck(ctx, rootfs); err != nil {
		return Manifest{}, err
	}
	pkgs, err := treePackages(rootfs)
	if err != nil {
		return Manifest{}, err
	}
	for p := range pkgs {
		if _, ok := b.base.Packages[p]; !ok {
			tm.DebianAdded = append(tm.DebianAdded, p)
		}
	}
	slices.Sort(tm.DebianAdded)
	b.prog.stage("hashing")
	sum, err := treeDigest(ctx, rootfs)
	if err != nil {
		if ctx.Err() != nil {
			return Manifest{}, ctx.Err()
		}
		return Manifest{}, classify(err)
	}
	b.prog.size(sum.size)
	m := Manifest{
		Name:         b.t.Name,
		Digest:       "sha256:" + sum.hex,
		DigestFormat: digestFormat,
		Created:      time.Now().UTC().Truncate(time.Second),
		Suite:        Suite,
		Mirror:       b.base.Mirror,
		Packages:     pkgs,
		Interpreter:  b.rt.Interpreter,
		SizeBytes:    sum.size,
		Template:     tm,
	}
	if len(b.t.DebianPackages) > 0 {
		m.Mirror = b.mirror
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, fmt.Errorf("encoding manifest: %w", err)
	}
	data = append(data, '\n')
	if _, err := s.checkImage(sum.hex, b.rt); err == nil {
		// This tree is in the store already (the same declaration built
		// again with Pull, say): keep it, since sandboxes may run from it,
		// if its content still matches its name, with today's manifest.
		if old, err := treeDigest(ctx, filepath.Join(s.imageDir(sum.hex), "rootfs")); err == nil && old.hex == sum.hex {
			if err := writeFileAtomic(s.imageDir(sum.hex), "manifest.json", data, fsmode.File); err != nil {
				return Manifest{}, fmt.Errorf("writing manifest: %w", classify(err))
			}
			return m, s.writeTemplateRef(b.t.Name, m.Digest)
		}
	}
	if err := writeFileSync(filepath.Join(tmp, "manifest.json"), data, fsmode.File); err != nil {
		return Manifest{}, fmt.Errorf("writing manifest: %w", classify(err))
	}
	if err := s.publish(ctx, tmp, sum.hex); err != nil {
		return Manifest{}, err
	}
	return m, s.writeTemplateRef(b.t.Name, m.Digest)
}

// copyFiles copies the operator's files into the tree, owned by root and
// read-only (files 0444, directories 0555), with the record of what a
// sandbox of the template runs with (templateInfoPath), and makes the
// template's working directory.
func (b *templateBuild) copyFiles(rootfs string, tm *TemplateManifest) ([]TemplateFile, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", rootfs, err)
	}
	defer root.Close()
	var data *os.Root
	if len(b.files) > 0 {
		if data, _, err = openDataRoot(b.opts.Sources.DataRoot); err != nil {
			return nil, err
		}
		defer data.Close()
	}
	var out []TemplateFile
	var dirs []string
	for _, f := range b.t.Files {
		rel := strings.TrimPrefix(path.Clean(f.Target), "/")
		if err := root.RemoveAll(rel); err != nil {
			return nil, fmt.Errorf("files: replacing %s: %w", f.Target, err)
		}
		if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
			return nil, fmt.Errorf("files: creating %s: %w", path.Dir(f.Target), err)
		}
	}
	for _, f := range b.files {
		rel := strings.TrimPrefix(f.target, "/")
		if f.dir {
			if err := root.Mkdir(rel, 0o755); err != nil {
				return nil, fmt.Errorf("files: creating %s: %w", f.target, err)
			}
			dirs = append(dirs, rel)
			continue
		}
		if err := copyInto(data, root, rel, f); err != nil {
			return nil, err
		}
		out = append(out, TemplateFile{Target: f.target, SHA256: f.sum})
	}
	// Directories last, deepest first: root may write into 0555 ones, but
	// a sandbox's user must not.
	for _, d := range slices.Backward(dirs) {
		if err := root.Chmod(d, 0o555); err != nil {
			return nil, fmt.Errorf("files: setting mode of /%s: %w", d, err)
		}
	}
	if w := path.Clean(b.t.Workdir); b.t.Workdir != "" && w != "/" && !within(w, "/tmp") && !within(w, "/workspace") {
		if err := root.MkdirAll(strings.TrimPrefix(w, "/"), 0o755); err != nil {
			return nil, errdefs.Publicf("workdir: cannot create %s in the image: %w", b.t.Workdir, errdefs.ErrInvalidArgument)
		}
	}
	info, err := json.MarshalIndent(map[string]any{"name": tm.Name, "base": tm.Base, "declaration": tm.Declaration,
		"env": tm.Env, "workdir": tm.Workdir, "start": tm.Start, "ready": tm.Ready}, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := replaceFile(root, templateInfoPath, append(info, '\n'), 0o444); err != nil {
		return nil, err
	}
	return out, nil
}

// copyInto copies the operator's file f, read through the data root data,
// to rel in root, checking that it still has the content it was hashed
// with.
func copyInto(data, root *os.Root, rel string, f fileInput) error {
	in, err := openRegular(data, f.rel)
	if err != nil {
		return errdefs.Publicf("files: %q cannot be read: %w", f.src, errdefs.ErrInvalidArgument)
	}
	defer in.Close()
	out, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("files: creating %s: %w", f.target, err)
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(out, h), in)
	if err == nil {
		err = out.Chown(0, 0)
	}
	if err == nil {
		err = out.Chmod(0o444)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("files: copying %s: %w", f.target, err)
	}
	if hex.EncodeToString(h.Sum(nil)) != f.sum {
		return errdefs.Publicf("files: %q changed during the build; build again: %w", f.src, errdefs.ErrInvalidArgument)
	}
	return nil
}

// within reports whether the clean absolute path p is dir or below it.
func within(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// templateRuntime is how a template's tree is hardened: as its base's,
// with every runtime's package managers stripped (a Debian package may
// bring pip to a shell template).
func templateRuntime(base Runtime) Runtime {
	rt := base
	rt.Strip = nil
	for _, n := range runtimeNames {
		rt.Strip = append(rt.Strip, Runtimes[n].Strip...)
	}
	slices.Sort(rt.Strip)
	rt.Strip = slices.Compact(rt.Strip)
	return rt
}

// copyTree copies the tree src to dst, which must not exist, keeping
// owners, modes, links and hard links (cp -a, sharing blocks where the
// file system can).
func copyTree(ctx context.Context, src, dst string) error {
	cmd := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", "--", src, dst)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		if isNoSpace(string(out)) {
			return errNoSpace
		}
		return fmt.Errorf("copying %s: %v: %s: %w", src, err, lastLines(string(out), 3), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// errNoSpace is a copy that filled the disk; build turns it into noSpace.
var errNoSpace = fmt.Errorf("copying the tree: %w", syscall.ENOSPC)

// isNoSpaceErr reports whether err is, or tells of, a full disk (the
// errors of the store's helpers keep the message, not the errno).
func isNoSpaceErr(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || strings.Contains(strings.ToLower(err.Error()), "no space left on device")
}

// lineWriter calls f with every complete line written to it.
type lineWriter struct {
	f       func(string)
	partial []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := strings.IndexByte(string(w.partial), '\n')
		if i < 0 {
			break
		}
		w.f(strings.TrimRight(string(w.partial[:i]), "\r"))
		w.partial = w.partial[i+1:]
	}
	if len(w.partial) > 64<<10 {
		w.partial = w.partial[:0]
	}
	return len(p), nil
}

// lastLines returns the last n non-empty lines of text, joined by " | ".
func lastLines(text string, n int) string {
	t := &tailWriter{max: len(text) + 1}
	t.Write([]byte(text))
	return t.lastLines(n)
}

// box is the build sandbox over rootfs with the build's options.
func (b *templateBuild) box(rootfs string, writable bool) buildBox {
	return buildBox{Runsc: b.opts.RunscPath, StateDir: b.opts.StateDir, Rootfs: rootfs, Writable: writable}
}
