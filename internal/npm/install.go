package npm

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/fsmode"
)

// Bounds of what Install downloads and unpacks.
const (
	// maxTarballBytes bounds one package's tarball.
	maxTarballBytes = 256 << 20
	// maxPackageBytes bounds what one tarball unpacks to.
	maxPackageBytes = 1 << 30
	// maxTarEntries bounds one tarball's entries.
	maxTarEntries = 100000
	// maxInstallBytes bounds what one Install unpacks in all.
	maxInstallBytes = 4 << 30
)

// Install downloads each package's tarball into cacheDir (keyed by its
// integrity, and reused from there; a few at a time) from the registry at
// registry, whose origin each Resolved URL must have, checks it against
// Integrity before reading it, and then unpacks its package directory into
// root/node_modules/<Path>. Parents are unpacked before the packages
// nested under them; a package's directory must not exist yet.
//
// Unpacking refuses entries that are absolute or have a ".." element, and
// devices and fifos; it skips symbolic and hard links, as npm does, and
// nothing is written through a link leading out of root. Directories are
// 0755, files 0644 (0755 when the tarball marks them executable), owned by
// root when Install runs as root. Each package's package.json must name
// its Name and Version. Install sets pkgs[i].Scripts when the package.json
// has an install script or the package a binding.gyp. On error, the
// package directories Install made are removed.
func Install(ctx context.Context, registry string, pkgs []Package, root, cacheDir string) error {
	for i := range pkgs {
		if err := checkPath(&pkgs[i]); err != nil {
			return err
		}
		if err := checkOrigin(pkgs[i].Resolved, registry); err != nil {
			return tarballURLError("", pkgs[i], registry, err)
		}
	}
	tgzs, err := fetchAll(ctx, pkgs, cacheDir)
	if err != nil {
		return err
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("opening the tree to install npm packages into: %w", err)
	}
	defer r.Close()
	order := make([]int, len(pkgs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		da, db := strings.Count(pkgs[order[a]].Path, "/node_modules/"), strings.Count(pkgs[order[b]].Path, "/node_modules/")
		if da != db {
			return da < db
		}
		return pkgs[order[a]].Path < pkgs[order[b]].Path
	})
	in := &installer{root: r, asRoot: os.Geteuid() == 0}
	for _, i := range order {
		if err := ctx.Err(); err != nil {
			in.rollback()
			return err
		}
		if err := in.install(&pkgs[i], tgzs[i]); err != nil {
			in.rollback()
			return err
		}
	}
	return nil
}

// installer is one Install's state.
type installer struct {
	root    *os.Root
	asRoot  bool
	created []string // package directories and node_modules made, in order
	written int64
}

// checkPath checks a package's Path: names joined by "/node_modules/",
// the last its Name.
func checkPath(p *Package) error {
	if !validName(p.Name) {
		return errdefs.Publicf("npm_packages: %q is not an npm package name: %w", p.Name, errdefs.ErrInvalidArgument)
	}
	parts := strings.Split(p.Path, "/node_modules/")
	for _, n := range parts {
		if !validName(n) {
			return errdefs.Publicf("npm_packages: %s@%s: path %q is not under node_modules: %w", p.Name, p.Version, p.Path, errdefs.ErrInvalidArgument)
		}
	}
	if parts[len(parts)-1] != p.Name {
		return errdefs.Publicf("npm_packages: %s@%s: path %q is not the package's: %w", p.Name, p.Version, p.Path, errdefs.ErrInvalidArgument)
	}
	return nil
}

// install unpacks one package's verified tarball.
func (in *installer) install(p *Package, tgz string) error {
	what := p.Name + "@" + p.Version
	dir := "node_modules/" + p.Path
	if err := in.mkdirs(path.Dir(dir)); err != nil {
		return err
	}
	if _, err := in.root.Lstat(dir); err == nil {
		return errdefs.Publicf("npm_packages: %s: node_modules/%s already exists (bundled by its parent?): %w", what, p.Path, errdefs.ErrConflict)
	}
	if err := in.mkdir(dir); err != nil {
		return err
	}
	f, err := os.Open(tgz)
	if err != nil {
		return fmt.Errorf("opening the tarball of %s: %w", what, err)
	}
	defer f.Close()
	x := &extractor{root: in.root, dir: dir, what: what, asRoot: in.asRoot, budget: min(maxPackageBytes, maxInstallBytes-in.written)}
	if err := x.extract(f); err != nil {
		return err
	}
	in.written += x.written
	return in.readPackageJSON(p, dir)
}

// readPackageJSON checks the unpacked package.json and notes install
// scripts.
func (in *installer) readPackageJSON(p *Package, dir string) error {
	what := p.Name + "@" + p.Version
	f, err := in.root.Open(dir + "/package.json")
	if err != nil {
		return errdefs.Publicf("npm_packages: %s: the tarball has no package.json: %w", what, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	var pj struct {
		Name    string                     `json:"name"`
		Version string                     `json:"version"`
		Scripts map[string]json.RawMessage `json:"scripts"`
	}
	if err := json.NewDecoder(io.LimitReader(f, 16<<20)).Decode(&pj); err != nil {
		return errdefs.Publicf("npm_packages: %s: its package.json cannot be read: %w", what, errdefs.ErrInvalidArgument)
	}
	v, err := parseVersion(pj.Version)
	if pj.Name != p.Name || err != nil || v.String() != p.Version {
		return errdefs.Publicf("npm_packages: %s: its package.json says %s@%s: %w", what, pj.Name, pj.Version, errdefs.ErrInvalidArgument)
	}
	for _, s := range []string{"preinstall", "install", "postinstall"} {
		if _, ok := pj.Scripts[s]; ok {
			p.Scripts = true
		}
	}
	if _, err := in.root.Lstat(dir + "/binding.gyp"); err == nil {
		p.Scripts = true // npm runs `node-gyp rebuild`
	}
	return nil
}

// mkdirs makes rel and its parents that do not exist, recording them.
func (in *installer) mkdirs(rel string) error {
	elems := strings.Split(rel, "/")
	for i := range elems {
		p := strings.Join(elems[:i+1], "/")
		st, err := in.root.Stat(p)
		if err == nil {
			if !st.IsDir() {
				return fmt.Errorf("installing npm packages: /%s is not a directory", p)
			}
			continue
		}
		if err := in.mkdir(p); err != nil {
			return err
		}
	}
	return nil
}

// mkdir makes one directory, 0755 and root's, recording it.
func (in *installer) mkdir(rel string) error {
	if err := in.root.Mkdir(rel, 0o755); err != nil {
		return treeError(rel, err)
	}
	in.created = append(in.created, rel)
	if err := in.root.Chmod(rel, 0o755); err != nil {
		return treeError(rel, err)
	}
	if in.asRoot {
		if err := in.root.Lchown(rel, 0, 0); err != nil {
			return treeError(rel, err)
		}
	}
	return nil
}

// rollback removes the directories Install made, deepest first.
func (in *installer) rollback() {
	for i := len(in.created) - 1; i >= 0; i-- {
		_ = in.root.RemoveAll(in.created[i])
	}
}

// treeError is a failure writing to the tree; one a link out of it
// causes says so.
func treeError(rel string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes") {
		return errdefs.Publicf("installing npm packages: /%s is reached through a link leading out of the image: %w", rel, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("installing npm packages: %w", err)
}

// digest parses an integrity string into a hash and the digest it must
// give.
func digest(integrity string) (hash.Hash, []byte, error) {
	algo, sum, ok := strings.Cut(integrity, "-")
	want, err := base64.StdEncoding.DecodeString(sum)
	if !ok || err != nil {
		return nil, nil, errors.New("integrity is not algorithm-base64")
	}
	var h hash.Hash
	switch algo {
	case "sha512":
		h = sha512.New()
	case "sha384":
		h = sha512.New384()
	case "sha256":
		h = sha256.New()
	case "sha1":
		h = sha1.New()
	default:
		return nil, nil, fmt.Errorf("integrity algorithm %q is not supported", algo)
	}
	if len(want) != h.Size() {
		return nil, nil, errors.New("integrity has the wrong length")
	}
	return h, want, nil
}

// fetchAll fetches the packages' tarballs, a few at a time, and returns
// their paths in the cache. The first error cancels the other fetches;
// the one returned is the first package's, in the list's order.
func fetchAll(ctx context.Context, pkgs []Package, cacheDir string) ([]string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	paths := make([]string, len(pkgs))
	errs := make([]error, len(pkgs))
	sem := make(chan struct{}, fetchers)
	var wg sync.WaitGroup
	for i := range pkgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			if paths[i], errs[i] = fetchTarball(ctx, &pkgs[i], cacheDir); errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return paths, nil
}

// fetchTarball returns the path of p's tarball in cacheDir, downloading it
// when it is not there, checked against p.Integrity.
func fetchTarball(ctx context.Context, p *Package, cacheDir string) (string, error) {
	what := p.Name + "@" + p.Version
	h, want, err := digest(p.Integrity)
	if err != nil {
		return "", errdefs.Publicf("npm_packages: %s: %s: %w", what, err.Error(), errdefs.ErrInvalidArgument)
	}
	algo, _, _ := strings.Cut(p.Integrity, "-")
	if cacheDir == "" {
		return "", fmt.Errorf("installing %s: no cache directory: %w", what, errdefs.ErrInvalidArgument)
	}
	dst := filepath.Join(cacheDir, algo+"-"+hex.EncodeToString(want)+".tgz")
	if cached(dst, h, want) {
		return dst, nil
	}
	h.Reset()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.Resolved, nil)
	if err != nil {
		return "", fmt.Errorf("downloading %s: %w", what, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("npm_packages: %s: downloading its tarball: %w: %w", what, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", errdefs.Publicf("npm_packages: %s: downloading its tarball: the registry answers %s: %w", what, resp.Status, errdefs.ErrUnavailable)
	}
	if err := os.MkdirAll(cacheDir, fsmode.Dir); err != nil {
		return "", fmt.Errorf("making the npm cache: %w", err)
	}
	tmp, err := os.CreateTemp(cacheDir, ".fetch-*")
	if err != nil {
		return "", fmt.Errorf("making the npm cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	defer tmp.Close()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(resp.Body, maxTarballBytes+1))
	if err != nil {
		return "", fmt.Errorf("npm_packages: %s: downloading its tarball: %w: %w", what, err, errdefs.ErrUnavailable)
	}
	if n > maxTarballBytes {
		return "", errdefs.Publicf("npm_packages: %s: its tarball is larger than %d MiB: %w", what, maxTarballBytes>>20, errdefs.ErrTooLarge)
	}
	if got := h.Sum(nil); string(got) != string(want) {
		return "", errdefs.Publicf("npm_packages: %s: its tarball does not have the integrity the registry gives (%s, got %s-%s): %w",
			what, p.Integrity, algo, base64.StdEncoding.EncodeToString(got), errdefs.ErrInvalidArgument)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("writing the npm cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("writing the npm cache: %w", err)
	}
	return dst, nil
}

// cached reports whether a cached tarball is there with its digest.
func cached(p string, h hash.Hash, want []byte) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := io.Copy(h, io.LimitReader(f, maxTarballBytes+1)); err != nil {
		return false
	}
	return string(h.Sum(nil)) == string(want)
}
