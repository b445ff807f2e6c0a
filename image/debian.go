package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/fsmode"
)

// A template's Debian packages are installed into a layer: a copy of the
// base runtime image's tree with the packages installed, kept under
// <root>/cache/layers/<hex> (layerDir), where <hex> is layerKey of the
// base image, the packages and the mirror. Changing a template's files,
// wheels or npm packages reuses its layer; changing its Debian packages
// builds a new one from the base image, never from Debian again.
//
// apt-get runs on the host, in a directory of the build's own with a
// configuration of its own (nothing of the host's apt configuration or
// package state is read or written): it resolves the packages against the
// base tree's dpkg status and downloads them. Its download methods, which
// parse what the mirror sends, run as the host's _apt user, as apt runs
// them: the directories they write (lists and archives partial/, below
// <root>/cache/apt) are _apt's, and the directories on the way to them
// may be passed through by anyone (fsmode.Exceptions). A build where apt
// would fall back to downloading as root fails instead. The packages are then
// installed inside a build sandbox (buildBox) over a copy of the base
// tree, by the tree's own apt-get from the downloaded files, without
// network: maintainer scripts run there, never on the host.

const (
	// layerRevision stands for how a layer is made; bump it when that
	// changes, so that no older layer is reused.
	layerRevision = 1
	// debianKeyring is the keyring the mirror's index must be signed with.
	debianKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
	// debsMount is where the downloaded packages appear in the build
	// sandbox.
	debsMount = "/.stockade-build/debs"
	// installTimeout bounds the install of a layer's packages.
	installTimeout = 20 * time.Minute
)

func (s *Store) layersDir() string { return filepath.Join(s.root, "cache", "layers") }
func (s *Store) aptDir() string    { return filepath.Join(s.root, "cache", "apt") }

// aptUser is the user apt's download methods run as.
const aptUser = "_apt"

// layerInfo is a layer's layer.json.
type layerInfo struct {
	Key      string   `json:"key"`
	Base     string   `json:"base"` // the base image's digest
	Packages []string `json:"packages"`
	Mirror   string   `json:"mirror"`
}

// layerKey is the hex digest naming the layer of packages over the image
// base with mirror.
func layerKey(base string, packages []string, mirror string) string {
	h := sha256.New()
	fmt.Fprintf(h, "layer %d\nsuite %q\nbase %q\nmirror %q\n", layerRevision, Suite, base, mirror)
	for _, p := range sortedCopy(packages) {
		fmt.Fprintf(h, "package %q\n", p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// debianLayer returns the host path of the tree of the layer of packages
// over the base image (baseDigest, baseRootfs), building it unless it is
// cached (or pull asks to resolve the packages again). The caller holds
// the lock. A layer becomes visible by a rename once complete.
func (s *Store) debianLayer(ctx context.Context, b *templateBuild, baseDigest, baseRootfs string) (key, rootfs string, err error) {
	key = layerKey(baseDigest, b.t.DebianPackages, b.mirror)
	final := filepath.Join(s.layersDir(), key)
	if !b.opts.Pull {
		if _, err := os.Stat(filepath.Join(final, "layer.json")); err == nil {
			return key, filepath.Join(final, "rootfs"), nil
		}
	}
	tmp, err := os.MkdirTemp(s.tmpDir(), "layer-")
	if err != nil {
		return "", "", fmt.Errorf("creating layer directory: %w", classify(err))
	}
	defer func() {
		if rerr := removeTree(tmp); rerr != nil && err == nil {
			err = fmt.Errorf("cleaning up layer directory: %w", classify(rerr))
		}
	}()
	apt, err := s.newAptRun(tmp, baseRootfs, b)
	if err != nil {
		return "", "", err
	}
	defer func() {
		if rerr := removeTree(apt.archives); rerr != nil && err == nil {
			err = fmt.Errorf("cleaning up apt's downloads: %w", classify(rerr))
		}
	}()
	b.prog.stage("resolving")
	if _, err := apt.run(ctx, "update"); err != nil {
		return "", "", err
	}
	uris, err := apt.run(ctx, append([]string{"install", "--print-uris", "-qq", "-y", "--"}, b.t.DebianPackages...)...)
	if err != nil {
		return "", "", err
	}
	total, totalBytes := countURIs(uris)
	b.prog.stage("downloading")
	b.prog.packages(0, total)
	var got int
	var gotBytes int64
	sizes := uriSizes(uris)
	apt.line = func(l string) {
		// "Get:1 URL SUITE/main ARCH NAME ARCH VERSION [SIZE]"
		if f := strings.Fields(l); len(f) >= 6 && strings.HasPrefix(f[0], "Get:") {
			got++
			gotBytes += sizes[f[4]]
			b.prog.packages(got, total)
			b.prog.size(min(gotBytes, totalBytes))
		}
	}
	if _, err := apt.run(ctx, append([]string{"install", "--download-only", "-y", "--"}, b.t.DebianPackages...)...); err != nil {
		return "", "", err
	}
	debs, err := filepath.Glob(filepath.Join(apt.archives, "*.deb"))
	if err != nil {
		return "", "", err
	}
	slices.Sort(debs)

	rootfs = filepath.Join(tmp, "rootfs")
	if err := copyTree(ctx, baseRootfs, rootfs); err != nil {
		return "", "", err
	}
	b.prog.stage("installing")
	if len(debs) > 0 {
		measuring, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { b.prog.measure(measuring, rootfs) })
		err := b.installDebs(ctx, rootfs, apt.archives, debs)
		stop()
		wg.Wait()
		if err != nil {
			return "", "", err
		}
	}
	if err := checkInstalled(rootfs, b.t.DebianPackages); err != nil {
		return "", "", err
	}
	if err := removeTree(apt.dir); err != nil {
		return "", "", fmt.Errorf("cleaning up apt: %w", classify(err))
	}
	info, err := json.MarshalIndent(layerInfo{Key: key, Base: baseDigest, Packages: sortedCopy(b.t.DebianPackages), Mirror: b.mirror}, "", "  ")
	if err != nil {
		return "", "", err
	}
	if err := writeFileSync(filepath.Join(tmp, "layer.json"), append(info, '\n'), fsmode.File); err != nil {
		return "", "", fmt.Errorf("writing layer: %w", classify(err))
	}
	if err := os.MkdirAll(s.layersDir(), fsmode.Dir); err != nil {
		return "", "", fmt.Errorf("creating layer cache: %w", classify(err))
	}
	syscall.Sync()
	if _, err := os.Lstat(final); err == nil {
		if err := s.discard(final); err != nil {
			return "", "", err
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", "", fmt.Errorf("publishing layer: %w", classify(err))
	}
	return key, filepath.Join(final, "rootfs"), syncDir(s.layersDir())
}

// installDebs installs the package files debs (in the host directory
// archives) into the tree at rootfs with the tree's own apt-get, in a
// build sandbox without network.
func (b *templateBuild) installDebs(ctx context.Context, rootfs, archives string, debs []string) error {
	args := []string{"/usr/bin/apt-get", "install", "-y", "--no-download",
		"-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root", "-o", "Dpkg::Use-Pty=0",
		"-o", "Dir::State::lists=/tmp/lists/", "-o", "Dir::Cache::archives=" + debsMount + "/",
		"-o", "APT::Install-Recommends=false", "-o", "Dpkg::Options::=--force-confold", "--"}
	for _, d := range debs {
		args = append(args, debsMount+"/"+filepath.Base(d))
	}
	var done int
	tail := &tailWriter{max: 16 << 10}
	lines := &lineWriter{f: func(l string) {
		if strings.HasPrefix(l, "Setting up ") {
			done++
			b.prog.packages(done, len(debs))
		}
	}}
	out := io.MultiWriter(tail, lines)
	if b.opts.Log != nil {
		out = io.MultiWriter(b.opts.Log, tail, lines)
	}
	box := b.box(rootfs, true)
	box.Inputs = map[string]string{debsMount: archives}
	box.Args = args
	box.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
		"LC_ALL=C", "DEBIAN_FRONTEND=noninteractive", "PYTHONHASHSEED=0", "SOURCE_DATE_EPOCH=0"}
	box.Timeout = installTimeout
	box.Out = out
	err := box.run(ctx)
	// The mount point the sandbox made in the tree.
	os.RemoveAll(filepath.Join(rootfs, ".stockade-build"))
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return err
	case errors.Is(err, errBoxTimeout):
		return errdefs.Publicf("debian_packages: installing the packages took longer than %v: %w", installTimeout, errdefs.ErrInvalidArgument)
	case isNoSpace(tail.String()):
		return noSpace(b.s)
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return errdefs.Publicf("debian_packages: installing the packages failed (exit status %d): %s: %w", ee.code, tail.lastLines(6), errdefs.ErrInvalidArgument)
	}
	return err
}

// checkInstalled reports the packages (names, "name=version") that the
// tree's dpkg database does not list as installed.
func checkInstalled(rootfs string, packages []string) error {
	pkgs, err := treePackages(rootfs)
	if err != nil {
		return err
	}
	for _, p := range packages {
		name, _, _ := strings.Cut(p, "=")
		if _, ok := pkgs[name]; !ok {
			return errdefs.Publicf("debian_packages: package %q is not installed after the build: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// aptRun is the host's apt-get set up for one layer.
type aptRun struct {
	path, dir, archives string
	env                 []string
	b                   *templateBuild
	// line, if set, sees every line apt-get writes.
	line func(string)
}

// newAptRun writes the configuration of apt-get in tmp/apt: sources from
// the build's mirror, the status of the tree at base, state and cache of
// its own (the index lists, and the downloaded packages while the build
// lasts, below the store's cache/apt, shared by its builds under its
// lock), no configuration of the host's.
func (s *Store) newAptRun(tmp, base string, b *templateBuild) (*aptRun, error) {
	if _, err := os.Stat(s.aptPath); err != nil {
		return nil, fmt.Errorf("apt-get not found at %s: template builds resolve Debian packages with the host's apt (apt-get install apt): %w", s.aptPath, errdefs.ErrFailedPrecondition)
	}
	u, err := user.Lookup(aptUser)
	if err != nil {
		return nil, fmt.Errorf("apt's download user %s: %v: template builds download Debian packages as it (apt-get install apt creates it): %w", aptUser, err, errdefs.ErrFailedPrecondition)
	}
	uid, uerr := strconv.Atoi(u.Uid)
	gid, gerr := strconv.Atoi(u.Gid)
	if uerr != nil || gerr != nil {
		return nil, fmt.Errorf("apt's download user %s has ids %q:%q: %w", aptUser, u.Uid, u.Gid, errdefs.ErrFailedPrecondition)
	}
	dir := filepath.Join(tmp, "apt")
	sum := sha256.Sum256([]byte(b.mirror))
	lists := filepath.Join(s.aptDir(), "lists-"+hex.EncodeToString(sum[:8]))
	a := &aptRun{path: s.aptPath, dir: dir, archives: filepath.Join(s.aptDir(), "archives"), b: b}
	for _, d := range []string{filepath.Join(dir, "parts"), filepath.Join(dir, "state")} {
		if err := os.MkdirAll(d, fsmode.Dir); err != nil {
			return nil, fmt.Errorf("creating apt directories: %w", classify(err))
		}
	}
	// A build that died left its downloads; the lock says none runs now.
	if err := removeTree(a.archives); err != nil {
		return nil, fmt.Errorf("cleaning up apt's downloads: %w", classify(err))
	}
	// The way to the partial directories, which _apt must pass through.
	for _, d := range []string{filepath.Dir(s.aptDir()), s.aptDir(), lists, a.archives} {
		if err := os.MkdirAll(d, fsmode.Traverse); err != nil {
			return nil, fmt.Errorf("creating apt directories: %w", classify(err))
		}
		if err := os.Chmod(d, fsmode.Traverse); err != nil {
			return nil, fmt.Errorf("setting the mode of %s: %w", d, classify(err))
		}
	}
	// What the methods write: _apt's alone, as apt makes its own.
	for _, d := range []string{filepath.Join(lists, "partial"), filepath.Join(a.archives, "partial")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating apt directories: %w", classify(err))
		}
		if err := os.Chown(d, uid, gid); err != nil {
			return nil, fmt.Errorf("giving %s to %s: %w", d, aptUser, classify(err))
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, fmt.Errorf("setting the mode of %s: %w", d, classify(err))
		}
	}
	sources := fmt.Sprintf("deb [signed-by=%s] %s %s main\n", debianKeyring, b.mirror, Suite)
	if err := os.WriteFile(filepath.Join(dir, "sources.list"), []byte(sources), fsmode.File); err != nil {
		return nil, fmt.Errorf("writing apt sources: %w", classify(err))
	}
	conf := map[string]string{
		"Dir::Etc::main":             "/dev/null",
		"Dir::Etc::Parts":            filepath.Join(dir, "parts"),
		"Dir::Etc::SourceList":       filepath.Join(dir, "sources.list"),
		"Dir::Etc::SourceParts":      filepath.Join(dir, "parts"),
		"Dir::Etc::Preferences":      "/dev/null",
		"Dir::Etc::PreferencesParts": filepath.Join(dir, "parts"),
		"Dir::State":                 filepath.Join(dir, "state"),
		"Dir::State::lists":          lists,
		"Dir::State::status":         filepath.Join(base, "var/lib/dpkg/status"),
		"Dir::Cache":                 filepath.Join(dir, "cache"),
		"Dir::Cache::archives":       a.archives,
		"Dir::Log":                   filepath.Join(dir, "log"),
		"Debug::NoLocking":           "1",
		"APT::Architecture":          debianArch(),
		"APT::Install-Recommends":    "false",
		"APT::Install-Suggests":      "false",
		"APT::Sandbox::User":         aptUser,
		"Acquire::Languages":         "none",
		"Acquire::Retries":           "2",
		"Acquire::http::Timeout":     "30",
		"Binary::apt-get::Acquire::AllowInsecureRepositories": "false",
	}
	var c strings.Builder
	for _, k := range slices.Sorted(maps.Keys(conf)) {
		fmt.Fprintf(&c, "%s %s;\n", k, strconv.Quote(conf[k]))
	}
	if err := os.WriteFile(filepath.Join(dir, "apt.conf"), []byte(c.String()), fsmode.File); err != nil {
		return nil, fmt.Errorf("writing apt configuration: %w", classify(err))
	}
	a.env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive",
		"APT_CONFIG=" + filepath.Join(dir, "apt.conf")}
	return a, nil
}

// run runs apt-get with args and returns its output. apt's refusals
// (a package that does not exist, versions that conflict) are errors
// naming debian_packages; a mirror that cannot be reached is
// ErrUnavailable.
func (a *aptRun) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, a.path, args...)
	cmd.Dir = a.dir
	cmd.Env = a.env
	var all strings.Builder
	lines := &lineWriter{f: func(l string) {
		if a.line != nil {
			a.line(l)
		}
	}}
	out := io.MultiWriter(&all, lines)
	if a.b.opts.Log != nil {
		out = io.MultiWriter(a.b.opts.Log, &all, lines)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	text := all.String()
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	if aerr := aptError(text); aerr != nil {
		return "", aerr
	}
	if err != nil {
		if isNoSpace(text) {
			return "", noSpace(a.b.s)
		}
		return "", fmt.Errorf("running apt-get %s: %v; last output: %s: %w", args[0], err, lastLines(text, 4), errdefs.ErrUnavailable)
	}
	return text, nil
}

var (
	aptNoPackage  = regexp.MustCompile(`^E: Unable to locate package (\S+)`)
	aptNoVersion  = regexp.MustCompile(`^E: Version '([^']*)' for '([^']*)' was not found`)
	aptNoCand     = regexp.MustCompile(`^E: Package '([^']*)' has no installation candidate`)
	aptBroken     = regexp.MustCompile(`^E: (Unable to correct problems|Unmet dependencies|Error, pkgProblemResolver)`)
	aptUnmetLine  = regexp.MustCompile(`^\s*(\S+) : (Depends|Breaks|Conflicts|PreDepends|Pre-Depends): (.*)$`)
	aptFetchError = regexp.MustCompile(`^(E|W): (Failed to fetch|Some index files failed|The repository)`)
	aptUnsandbox  = regexp.MustCompile(`^(E|W): (Download is performed unsandboxed|No sandbox user)`)
)

// aptError turns apt-get's errors in out into the template's: nil when out
// has none.
func aptError(out string) error {
	var unmet []string
	for l := range strings.Lines(out) {
		l = strings.TrimRight(l, "\n")
		if m := aptUnmetLine.FindStringSubmatch(l); m != nil {
			unmet = append(unmet, strings.TrimSpace(m[1]+" "+m[2]+" "+m[3]))
		}
	}
	for l := range strings.Lines(out) {
		l = strings.TrimRight(l, "\n")
		if aptUnsandbox.MatchString(l) {
			return fmt.Errorf("apt would download as root, not as %s: %s; the data directory and the directories above it must be passable (mode o+x) for %s: %w",
				aptUser, strings.TrimSpace(l), aptUser, errdefs.ErrFailedPrecondition)
		}
		if m := aptNoPackage.FindStringSubmatch(l); m != nil {
			return errdefs.Publicf("debian_packages: package %q does not exist in %s: %w", m[1], Suite, errdefs.ErrInvalidArgument)
		}
		if m := aptNoVersion.FindStringSubmatch(l); m != nil {
			return errdefs.Publicf("debian_packages: version %q of package %q does not exist in %s: %w", m[1], m[2], Suite, errdefs.ErrInvalidArgument)
		}
		if m := aptNoCand.FindStringSubmatch(l); m != nil {
			return errdefs.Publicf("debian_packages: package %q has no installable version in %s: %w", m[1], Suite, errdefs.ErrInvalidArgument)
		}
		if aptBroken.MatchString(l) {
			if len(unmet) > 5 {
				unmet = append(unmet[:5], "...")
			}
			return errdefs.Publicf("debian_packages: the packages conflict (%s): %w", strings.Join(unmet, "; "), errdefs.ErrInvalidArgument)
		}
		if aptFetchError.MatchString(l) {
			return fmt.Errorf("fetching from the Debian mirror: %s: %w", strings.TrimSpace(l), errdefs.ErrUnavailable)
		}
	}
	return nil
}

// countURIs counts the packages of apt-get --print-uris output and their
// bytes.
func countURIs(out string) (int, int64) {
	var n int
	var size int64
	for _, s := range uriSizes(out) {
		n++
		size += s
	}
	return n, size
}

// uriSizes maps the package names of apt-get --print-uris output
// ("'URL' NAME_VERSION_ARCH.deb SIZE HASH") to their sizes.
func uriSizes(out string) map[string]int64 {
	m := map[string]int64{}
	for l := range strings.Lines(out) {
		f := strings.Fields(l)
		if len(f) < 3 || !strings.HasPrefix(f[0], "'") || !strings.HasSuffix(f[1], ".deb") {
			continue
		}
		size, _ := strconv.ParseInt(f[2], 10, 64)
		name, _, _ := strings.Cut(f[1], "_")
		m[name] = size
	}
	return m
}

// debianArch is the Debian architecture of this host.
func debianArch() string {
	switch runtime.GOARCH {
	case "arm64":
		return "arm64"
	case "386":
		return "i386"
	}
	return runtime.GOARCH
}

// isNoSpace reports whether a program's output says the disk is full.
func isNoSpace(out string) bool { return strings.Contains(out, "No space left on device") }

// noSpace is the error of a build that ran out of disk space.
func noSpace(s *Store) error {
	return fmt.Errorf("%w (in %s)", errdefs.Publicf("the build ran out of disk space in the image store; free some (stockade image prune) and build again: %w", errdefs.ErrResourceExhausted), s.root)
}

// removeLayers deletes the layers not in keep; the caller holds the lock.
func (s *Store) removeLayers(keep map[string]bool) error {
	ents, err := os.ReadDir(s.layersDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing layers: %w", classify(err))
	}
	for _, e := range ents {
		if keep[e.Name()] {
			continue
		}
		if err := s.discard(filepath.Join(s.layersDir(), e.Name())); err != nil {
			return err
		}
	}
	return nil
}
