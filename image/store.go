// Package image builds, stores and verifies the runtime images sandboxes run
// in: Debian root filesystems made with debootstrap, hardened (no package
// managers, no setuid programs, mount points for the sandbox), and kept in a
// content-addressed store under one root directory:
//
//	<root>/images/sha256/<hex>/rootfs         the tree, read-only in sandboxes
//	<root>/images/sha256/<hex>/manifest.json  what it is (Manifest)
//	<root>/images/refs/<name>                 "sha256:<hex>" of the current image
//	<root>/images/refs/templates/<name>       the same for a template (BuildTemplate)
//	<root>/images/tmp/                        builds in progress
//	<root>/cache/debs/                        debootstrap's package cache
//	<root>/cache/layers/<hex>/                templates' Debian layers (debian.go)
//	<root>/cache/apt/, cache/wheels/          apt's index lists, fetched wheels
//
// <hex> is the digest of the tree (see Manifest.Digest). Every change is a
// rename, so a reader sees either the old image or the new one, and a build
// that fails or is interrupted leaves nothing behind.
//
//	s := image.Open("/var/lib/stockade")
//	if _, err := s.Build(ctx, "python", image.BuildOptions{}); err != nil { ... }
//	img, err := s.Resolve("python") // sandbox.Image for sandbox.Spec
package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// Manifest describes one built image. It is stored beside the rootfs as
// manifest.json.
type Manifest struct {
	// Name is the runtime the image was built for ("python", "node", "shell").
	Name string `json:"name"`
	// Digest is "sha256:<hex>", the digest of the root filesystem tree
	// (paths, types, modes, owners, symlink targets and file contents; not
	// times). <hex> names the image's directory.
	Digest string `json:"digest"`
	// DigestFormat names the tree encoding Digest was computed over.
	DigestFormat string    `json:"digest_format"`
	Created      time.Time `json:"created"`
	// Suite is the Debian suite ("trixie").
	Suite  string `json:"suite"`
	Mirror string `json:"mirror"`
	// Packages maps every installed Debian package to its version.
	Packages    map[string]string `json:"packages"`
	Interpreter []string          `json:"interpreter"`
	// Definition is the digest of what the image was built from (the
	// suite, the runtime's packages, interpreter and strip patterns, the
	// common hardening); empty in images built before it was recorded.
	// Build rebuilds an image whose definition is not the runtime's.
	Definition string `json:"definition,omitempty"`
	// SizeBytes is the apparent size of the regular files of the tree,
	// hard links counted once.
	SizeBytes int64 `json:"size_bytes"`
	// Template is set in the image of a template (BuildTemplate): Name is
	// then the template's, and Interpreter its base runtime's.
	Template *TemplateManifest `json:"template,omitempty"`
}

// Store is a content-addressed store of runtime images under one root
// directory. It is safe for concurrent use, also by several processes: the
// operations that change the store hold a lock file.
type Store struct {
	root string
	// bootstrap fills the empty directory rootfs with an unhardened Debian
	// tree for rt. Tests replace it; the default runs debootstrap.
	bootstrap func(ctx context.Context, rootfs string, rt Runtime, opts BuildOptions) error
	// debootstrapPath is the debootstrap program the default bootstrap runs.
	debootstrapPath string
	// aptPath is the apt-get that resolves and downloads templates'
	// Debian packages.
	aptPath string

	// manifests are the manifests decoded so far, by path, each with the
	// bytes it was decoded from: Resolve runs before every sandbox, and
	// decoding the manifest was most of its cost (0.2 of 0.3 ms). A file
	// whose bytes differ is decoded again.
	manifestsMu sync.Mutex
	manifests   map[string]decodedManifest
}

// decodedManifest is a manifest and the bytes it was decoded from.
type decodedManifest struct {
	data []byte
	m    Manifest
}

// readManifestFile reads and decodes the manifest at path, or returns the
// one decoded from the same bytes before.
func (s *Store) readManifestFile(path string) (Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Manifest{}, fmt.Errorf("reading manifest: %w", err)
	}
	s.manifestsMu.Lock()
	d, ok := s.manifests[path]
	s.manifestsMu.Unlock()
	if !ok || !bytes.Equal(d.data, data) {
		var m Manifest
		if err := json.Unmarshal(data, &m); err != nil {
			return Manifest{}, fmt.Errorf("manifest %s is unreadable: %v", path, err)
		}
		d = decodedManifest{data: data, m: m}
		s.manifestsMu.Lock()
		if s.manifests == nil {
			s.manifests = map[string]decodedManifest{}
		}
		s.manifests[path] = d
		s.manifestsMu.Unlock()
	}
	// Each caller gets a Manifest of its own.
	m := d.m
	m.Packages, m.Interpreter = maps.Clone(m.Packages), slices.Clone(m.Interpreter)
	m.Template = m.Template.clone()
	return m, nil
}

// Open returns the store rooted at root, which need not exist yet: Build
// creates it. Open does no I/O.
func Open(root string) *Store {
	if abs, err := filepath.Abs(root); err == nil {
		root = abs
	}
	s := &Store{root: root, debootstrapPath: "/usr/sbin/debootstrap", aptPath: "/usr/bin/apt-get"}
	s.bootstrap = s.debootstrap
	return s
}

// Root returns the store's root directory, absolute.
func (s *Store) Root() string { return s.root }

func (s *Store) imagesDir() string { return filepath.Join(s.root, "images") }
func (s *Store) tmpDir() string    { return filepath.Join(s.root, "images", "tmp") }
func (s *Store) refsDir() string   { return filepath.Join(s.root, "images", "refs") }
func (s *Store) blobsDir() string  { return filepath.Join(s.root, "images", "sha256") }
func (s *Store) cacheDir() string  { return filepath.Join(s.root, "cache", "debs") }

func (s *Store) imageDir(hex string) string { return filepath.Join(s.blobsDir(), hex) }

// Resolve returns the current image of the runtime name, ready to put in a
// sandbox.Spec. It is cheap (it reads two small files and stats three paths,
// and never hashes the tree) and meant to run on every sandbox creation.
//
// Errors: ErrInvalidArgument for a name that is not a runtime, ErrNotFound
// when the image was never built, ErrFailedPrecondition when the store is
// damaged (unreadable manifest, digest mismatch, missing rootfs, interpreter
// or guest mount point). Each names the command that fixes it.
func (s *Store) Resolve(name string) (sandbox.Image, error) {
	_, img, err := s.load(name)
	return img, err
}

// Current returns the manifest of the image of the runtime name if it is
// valid (as Resolve checks) and built from the runtime's current
// definition: its packages, interpreter, strip patterns and hardening.
// An image built from an older definition is an ErrFailedPrecondition
// that says what changed; Build without Force rebuilds it.
func (s *Store) Current(name string) (Manifest, error) {
	m, _, err := s.load(name)
	if err != nil {
		return Manifest{}, err
	}
	if why := outdated(m, Runtimes[name]); why != "" {
		return Manifest{}, fmt.Errorf("image %q is out of date (%s); rebuild it with \"stockade image build %s\" (or \"stockade setup\"): %w", name, why, name, errdefs.ErrFailedPrecondition)
	}
	return m, nil
}

// List returns the manifests of the runtimes that have an image, in build
// order. Images that cannot be loaded are left out of the list and reported
// in the error, so a damaged image does not hide the others.
func (s *Store) List() ([]Manifest, error) {
	var out []Manifest
	var errs []error
	for _, name := range runtimeNames {
		m, _, err := s.load(name)
		switch {
		case err == nil:
			out = append(out, m)
		case !errdefs.IsNotFound(err):
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// Remove deletes the ref of name and, unless another ref uses it, its image.
// Removing an image that is not built succeeds. The caller must make sure no
// sandbox runs from the image. Remove fails with ErrUnavailable while another
// operation (a build) holds the store's lock.
func (s *Store) Remove(name string) error {
	if _, err := runtimeFor(name); err != nil {
		return err
	}
	unlock, err := s.tryLock()
	if err != nil {
		return err
	}
	defer unlock()
	digest, err := s.readRef(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing image %q: %w", name, classify(err))
	}
	if err := os.Remove(filepath.Join(s.refsDir(), name)); err != nil {
		return fmt.Errorf("removing ref of image %q: %w", name, classify(err))
	}
	if err := syncDir(s.refsDir()); err != nil {
		return err
	}
	used, err := s.usedDigests()
	if err != nil {
		return err
	}
	hex := strings.TrimPrefix(digest, "sha256:")
	if used[hex] || !hexDigest.MatchString(hex) {
		return nil
	}
	return s.discard(s.imageDir(hex))
}

// Prune deletes every image that no ref points to and keep does not name
// (the images replaced by forced rebuilds and by later builds of a
// template) and returns their digests, and the cached Debian layers no
// template's current build was made on. keep are the digests
// ("sha256:<hex>") of the images sandboxes still run from: a daemon's
// (engine.Engine.ImagesInUse). Prune fails with ErrUnavailable while
// another operation holds the store's lock.
func (s *Store) Prune(keep []string) ([]string, error) {
	unlock, err := s.tryLock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	used, err := s.usedDigests()
	if err != nil {
		return nil, err
	}
	for _, d := range keep {
		used[strings.TrimPrefix(d, "sha256:")] = true
	}
	_, layers, err := s.usedTemplates()
	if err != nil {
		return nil, err
	}
	if err := s.removeLayers(layers); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(s.blobsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing images: %w", classify(err))
	}
	var pruned []string
	for _, e := range ents {
		if used[e.Name()] {
			continue
		}
		if err := s.discard(s.imageDir(e.Name())); err != nil {
			return pruned, err
		}
		pruned = append(pruned, "sha256:"+e.Name())
	}
	return pruned, nil
}

// discard moves dir out of the store's namespace with one rename, then
// deletes it, so that an interrupted deletion never leaves a half-deleted
// image where Resolve would find it. The caller holds the lock.
func (s *Store) discard(dir string) error {
	if err := os.MkdirAll(s.tmpDir(), 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", s.tmpDir(), classify(err))
	}
	trash, err := os.MkdirTemp(s.tmpDir(), "discard-")
	if err != nil {
		return fmt.Errorf("creating trash directory: %w", classify(err))
	}
	if err := os.Rename(dir, filepath.Join(trash, "image")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		os.Remove(trash)
		return fmt.Errorf("moving %s aside: %w", dir, classify(err))
	}
	if err := removeTree(trash); err != nil {
		return fmt.Errorf("deleting %s: %w", dir, classify(err))
	}
	return nil
}

// usedDigests returns the hex digests the refs point to, the templates'
// included.
func (s *Store) usedDigests() (map[string]bool, error) {
	used, _, err := s.usedTemplates()
	if err != nil {
		return nil, err
	}
	for _, name := range runtimeNames {
		d, err := s.readRef(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading ref of image %q: %w", name, classify(err))
		}
		used[strings.TrimPrefix(d, "sha256:")] = true
	}
	return used, nil
}

// hexDigest matches the hex part of a sha256 digest.
var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// runtimeFor returns the runtime name, or ErrInvalidArgument listing the
// known ones.
func runtimeFor(name string) (Runtime, error) {
	rt, ok := Runtimes[name]
	if !ok {
		known := make([]string, 0, len(Runtimes))
		for n := range Runtimes {
			known = append(known, n)
		}
		sort.Strings(known)
		return Runtime{}, fmt.Errorf("unknown runtime %q (known: %s): %w", name, strings.Join(known, ", "), errdefs.ErrInvalidArgument)
	}
	return rt, nil
}

func notBuilt(name string) error {
	return fmt.Errorf("image %q is not built; run \"stockade image build %s\" (or \"stockade setup\"): %w", name, name, errdefs.ErrNotFound)
}

func corrupted(name, why string) error {
	return fmt.Errorf("image %q is damaged (%s); rebuild with \"stockade image build --force %s\": %w", name, why, name, errdefs.ErrFailedPrecondition)
}

// classify wraps an I/O error in its error class: ErrPermissionDenied when
// the store is not accessible to this user (still fs.ErrPermission too, so
// that a caller can tell the host's permissions from a refusal of
// Stockade's), ErrFailedPrecondition otherwise.
func classify(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w (run as root): %w", err, errdefs.ErrPermissionDenied)
	}
	return fmt.Errorf("%v: %w", err, errdefs.ErrFailedPrecondition)
}

// readRef returns the digest the ref of name holds. A missing ref is an
// error satisfying errors.Is(err, fs.ErrNotExist).
func (s *Store) readRef(name string) (string, error) {
	data, err := os.ReadFile(filepath.Join(s.refsDir(), name))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// load resolves name to its manifest and image, with the checks Resolve
// documents.
func (s *Store) load(name string) (Manifest, sandbox.Image, error) {
	rt, err := runtimeFor(name)
	if err != nil {
		return Manifest{}, sandbox.Image{}, err
	}
	digest, err := s.readRef(name)
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, sandbox.Image{}, notBuilt(name)
	}
	if err != nil {
		return Manifest{}, sandbox.Image{}, fmt.Errorf("reading ref of image %q: %w", name, classify(err))
	}
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || !hexDigest.MatchString(hex) {
		return Manifest{}, sandbox.Image{}, corrupted(name, fmt.Sprintf("ref holds %q, not a sha256 digest", digest))
	}
	m, err := s.checkImage(hex, rt)
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return Manifest{}, sandbox.Image{}, fmt.Errorf("loading image %q: %w", name, classify(err))
		}
		return Manifest{}, sandbox.Image{}, corrupted(name, err.Error())
	}
	return m, sandbox.Image{Name: name, Digest: m.Digest, Rootfs: filepath.Join(s.imageDir(hex), "rootfs")}, nil
}

// checkImage reads the manifest of the image hex and checks, without
// hashing the tree, that the image is complete for rt. Its errors describe
// the damage; the caller classifies them.
func (s *Store) checkImage(hex string, rt Runtime) (Manifest, error) {
	dir := s.imageDir(hex)
	m, err := s.readManifestFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return Manifest{}, err
	}
	if m.Digest != "sha256:"+hex {
		return Manifest{}, fmt.Errorf("manifest digest %q does not match directory %s", m.Digest, dir)
	}
	if m.DigestFormat != digestFormat {
		return Manifest{}, fmt.Errorf("manifest digest format %q is not %q", m.DigestFormat, digestFormat)
	}
	rootfs := filepath.Join(dir, "rootfs")
	if fi, err := os.Lstat(rootfs); err != nil {
		return Manifest{}, fmt.Errorf("inspecting rootfs: %w", err)
	} else if !fi.IsDir() {
		return Manifest{}, fmt.Errorf("%s is not a directory", rootfs)
	}
	interp := rt.Interpreter[0]
	p, err := resolveInRoot(rootfs, interp)
	if err != nil {
		return Manifest{}, fmt.Errorf("interpreter %s: %w", interp, err)
	}
	if fi, err := os.Lstat(p); err != nil {
		return Manifest{}, fmt.Errorf("interpreter %s: %w", interp, err)
	} else if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return Manifest{}, fmt.Errorf("interpreter %s is not an executable file", interp)
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, GuestPath)); err != nil {
		return Manifest{}, fmt.Errorf("guest mount point %s: %w", GuestPath, err)
	} else if !fi.Mode().IsRegular() {
		return Manifest{}, fmt.Errorf("guest mount point %s is not a regular file", GuestPath)
	}
	return m, nil
}

// resolveInRoot returns the host path of the absolute path p inside the tree
// at root, following symlinks as if root were "/": an absolute target and
// ".." never lead outside root.
func resolveInRoot(root, p string) (string, error) {
	pending := strings.Split(p, "/")
	cur := "/"
	links := 0
	for len(pending) > 0 {
		part := pending[0]
		pending = pending[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, part)
		host := filepath.Join(root, filepath.FromSlash(next))
		fi, err := os.Lstat(host)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > 40 {
			return "", &fs.PathError{Op: "resolve", Path: p, Err: syscall.ELOOP}
		}
		target, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			cur = "/"
		}
		pending = append(strings.Split(target, "/"), pending...)
	}
	return filepath.Join(root, filepath.FromSlash(cur)), nil
}

// Verify hashes the whole tree of the image of name and checks it against
// the image's digest. It reads every file (seconds for the python image), so
// it is for operators and health checks, not for every sandbox. Errors are
// those of Resolve, and ErrFailedPrecondition when the content has changed.
func (s *Store) Verify(ctx context.Context, name string) error {
	m, img, err := s.load(name)
	if err != nil {
		return err
	}
	sum, err := treeDigest(ctx, img.Rootfs)
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("verifying image %q: %w", name, ctx.Err())
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("verifying image %q: %w", name, classify(err))
	case err != nil:
		return corrupted(name, err.Error())
	case "sha256:"+sum.hex != m.Digest:
		return corrupted(name, fmt.Sprintf("its content hashes to sha256:%s, not %s", sum.hex, m.Digest))
	}
	return nil
}
