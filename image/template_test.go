package image

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/templates"
)

// installedStore is the store `make setup` fills, whose images the
// template tests build on (read only).
func installedStore() string {
	if d := os.Getenv("STOCKADE_DATA_DIR"); d != "" {
		return d
	}
	return config.DefaultDataDir
}

// requireTemplateBuild skips the test unless template builds can run here
// (with CI=true it fails instead): root, runsc, apt-get and the installed
// image of base.
func requireTemplateBuild(t testing.TB, base string) {
	t.Helper()
	var reason string
	if os.Geteuid() != 0 {
		reason = "template builds need root"
	} else if _, err := exec.LookPath("runsc"); err != nil {
		reason = "runsc is not on PATH (stockade setup)"
	} else if _, err := os.Stat("/usr/bin/apt-get"); err != nil {
		reason = "apt-get is not installed"
	} else if _, err := Open(installedStore()).Resolve(base); err != nil {
		reason = fmt.Sprintf("the %s image is not built (stockade setup): %v", base, err)
	}
	if reason != "" {
		missing(t, "cannot build a template: "+reason)
	}
}

// templateStore returns a store in a temporary directory whose image of
// base is the installed one, linked (never written), and a data directory
// for the templates' files.
func templateStore(t testing.TB, base string) (*Store, string) {
	t.Helper()
	installed := Open(installedStore())
	img, err := installed.Resolve(base)
	if err != nil {
		t.Fatal(err)
	}
	s := Open(t.TempDir())
	// The data directory and the directories above it may be passed
	// through, as set-up makes them: apt's methods run as _apt.
	for _, d := range []string{filepath.Dir(s.root), s.root} {
		if err := os.Chmod(d, fsmode.Traverse); err != nil {
			t.Fatal(err)
		}
	}
	hex := strings.TrimPrefix(img.Digest, "sha256:")
	if err := os.MkdirAll(s.blobsDir(), fsmode.Traverse); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.refsDir(), fsmode.Dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(installed.imageDir(hex), s.imageDir(hex)); err != nil {
		t.Fatal(err)
	}
	if err := s.writeRef(base, img.Digest); err != nil {
		t.Fatal(err)
	}
	return s, t.TempDir()
}

// stages records the stages a build reports, in order.
type stages struct {
	mu   sync.Mutex
	list []string
	on   func(Progress)
	logf func(string, ...any)
}

func (r *stages) progress(p Progress) {
	r.mu.Lock()
	if len(r.list) == 0 || r.list[len(r.list)-1] != p.Stage {
		r.list = append(r.list, p.Stage)
		if r.logf != nil {
			r.logf("%v: %s", p.Elapsed.Round(time.Millisecond), p.Stage)
		}
	}
	on := r.on
	r.mu.Unlock()
	if on != nil {
		on(p)
	}
}

func (r *stages) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

// assertClean checks that no build left anything in the store's tmp
// directory or a build sandbox's state.
func assertClean(t *testing.T, s *Store, stateDir string) {
	t.Helper()
	for _, d := range []string{s.tmpDir(), stateDir} {
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Errorf("%s holds %d entries after the build, want none (%s)", d, len(ents), ents[0].Name())
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), stateDir) {
			t.Errorf("a process of a build sandbox is left: %s: %q", p, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

// TestBuildTemplateShell builds shell templates with Debian packages from
// the mirror (installed in runsc build sandboxes), files, env and start
// checks, then rebuilds, breaks, grows and cancels them.
func TestBuildTemplateShell(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping real template builds in -short mode")
	}
	requireTemplateBuild(t, "shell")
	s, data := templateStore(t, "shell")
	stateDir := t.TempDir()
	writeTree(t, data, map[string]string{
		"model.json":   `{"answer": 42}`,
		"conf/a.txt":   "a",
		"conf/sub/b.x": "b",
	})
	tpl := templates.Template{
		Name:           "tools",
		Base:           "shell",
		DebianPackages: []string{"jq"},
		Files: []templates.File{
			{Source: filepath.Join(data, "model.json"), Target: "/opt/tools/model.json"},
			{Source: filepath.Join(data, "conf"), Target: "/etc/tools"},
		},
		Env:     map[string]string{"GREETING": "hi"},
		Workdir: "/opt/tools",
		Start:   `test "$GREETING" = hi && test "$(pwd)" = /opt/tools && jq -e '.answer == 42' model.json`,
		Ready:   `test -r /etc/tools/sub/b.x && ! touch /opt/tools/x 2>/dev/null`,
	}
	var log strings.Builder
	var logMu sync.Mutex
	opts := func(st *stages) TemplateOptions {
		return TemplateOptions{StateDir: stateDir, Progress: st.progress, Sources: TemplateSources{DataRoot: data},
			Log: writerFunc(func(p []byte) { logMu.Lock(); log.Write(p); logMu.Unlock() })}
	}

	base, err := s.Resolve("shell")
	if err != nil {
		t.Fatal(err)
	}
	baseBefore := digestOf(t, base.Rootfs)

	var first Manifest
	t.Run("build", func(t *testing.T) {
		st := &stages{logf: t.Logf}
		m, err := s.BuildTemplate(t.Context(), tpl, opts(st))
		if err != nil {
			t.Fatalf("BuildTemplate: %v\n%s", err, log.String())
		}
		first = m
		for _, want := range []string{"resolving", "downloading", "installing", "files", "hardening", "checking", "hashing"} {
			if !slices.Contains(st.get(), want) {
				t.Errorf("stages %v lack %s", st.get(), want)
			}
		}
		if m.Template == nil || m.Template.Name != "tools" || m.Template.Base != "shell" || m.Template.Key == "" || m.Template.Layer == "" {
			t.Fatalf("manifest's template = %+v", m.Template)
		}
		if v := m.Packages["jq"]; v == "" {
			t.Errorf("the SBOM lacks jq: %v", m.Packages)
		}
		if _, ok := m.Packages["busybox"]; !ok {
			t.Errorf("the SBOM lacks the base's busybox")
		}
		for _, p := range []string{"jq", "libjq1"} {
			if !slices.Contains(m.Template.DebianAdded, p) {
				t.Errorf("DebianAdded = %v, lacks %s", m.Template.DebianAdded, p)
			}
		}
		if slices.Contains(m.Template.DebianAdded, "busybox") {
			t.Errorf("DebianAdded = %v holds a package of the base", m.Template.DebianAdded)
		}
		// apt downloaded as _apt (a fallback to root fails the build):
		// the partial directory its methods wrote is _apt's, and the
		// build's downloads are gone.
		apt, err := user.Lookup(aptUser)
		if err != nil {
			t.Fatal(err)
		}
		partials, _ := filepath.Glob(filepath.Join(s.aptDir(), "lists-*", "partial"))
		if len(partials) != 1 {
			t.Fatalf("apt's lists: %v, want one partial directory", partials)
		}
		if fi, err := os.Stat(partials[0]); err != nil || fmt.Sprint(fi.Sys().(*syscall.Stat_t).Uid) != apt.Uid || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want %s's, 0700", partials[0], fi.Mode(), err, aptUser)
		}
		if _, err := os.Lstat(filepath.Join(s.aptDir(), "archives")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the build's downloads: %v, want them removed", err)
		}
		targets := map[string]string{}
		for _, f := range m.Template.Files {
			targets[f.Target] = f.SHA256
		}
		if len(targets) != 3 || targets["/opt/tools/model.json"] == "" || targets["/etc/tools/sub/b.x"] == "" {
			t.Errorf("files = %v, want model.json, a.txt and sub/b.x", m.Template.Files)
		}
		img, rm, err := s.ResolveTemplate("tools")
		if err != nil || img.Digest != m.Digest || rm.Template.Env["GREETING"] != "hi" || img.Name != "tools" {
			t.Fatalf("ResolveTemplate = %+v, %+v, %v", img, rm.Template, err)
		}
		for _, c := range []struct {
			path string
			mode os.FileMode
		}{{"opt/tools/model.json", 0o444}, {"etc/tools/sub", os.ModeDir | 0o555}, {"etc/tools/sub/b.x", 0o444}} {
			fi, err := os.Lstat(filepath.Join(img.Rootfs, c.path))
			if err != nil || fi.Mode() != c.mode || fi.Sys().(*syscall.Stat_t).Uid != 0 {
				t.Errorf("%s: %v, %v; want mode %v owned by root", c.path, fi.Mode(), err, c.mode)
			}
		}
		out, err := exec.CommandContext(t.Context(), "chroot", "--userspec=65534:65534", img.Rootfs,
			"/usr/bin/jq", "-r", ".answer", "/opt/tools/model.json").CombinedOutput()
		if err != nil || string(out) != "42\n" {
			t.Errorf("jq in the image: %q, %v", out, err)
		}
		if ms, err := s.Templates(); err != nil || len(ms) != 1 || ms[0].Digest != m.Digest {
			t.Errorf("Templates = %v, %v", ms, err)
		}
		// (Not Verify: the installed image is other tests' too.)
		if after := digestOf(t, base.Rootfs); after != baseBefore {
			t.Errorf("the base image's tree changed during the build: %s, then %s", baseBefore, after)
		}
		assertClean(t, s, stateDir)
	})
	if first.Digest == "" {
		t.FailNow()
	}

	t.Run("cache hit", func(t *testing.T) {
		// Neither apt nor runsc can run: a build that does any work fails.
		apt := s.aptPath
		s.aptPath = "/nonexistent/apt-get"
		defer func() { s.aptPath = apt }()
		st := &stages{}
		o := opts(st)
		o.RunscPath = "/nonexistent/runsc"
		m, err := s.BuildTemplate(t.Context(), tpl, o)
		if err != nil || m.Digest != first.Digest {
			t.Fatalf("second build = %s, %v; want %s", m.Digest, err, first.Digest)
		}
		if got := st.get(); len(got) != 0 {
			t.Errorf("a cache hit reported stages %v", got)
		}
		// The check can see work: the same build with Pull resolves again.
		o.Pull = true
		if _, err := s.BuildTemplate(t.Context(), tpl, o); err == nil || !strings.Contains(err.Error(), "apt-get not found") {
			t.Errorf("a pulled build without apt-get = %v, want it to fail for apt-get", err)
		}
		assertClean(t, s, stateDir)
	})

	t.Run("pull rebuilds the same tree", func(t *testing.T) {
		st := &stages{}
		o := opts(st)
		o.Pull = true
		m, err := s.BuildTemplate(t.Context(), tpl, o)
		if err != nil {
			t.Fatalf("BuildTemplate with Pull: %v", err)
		}
		if !slices.Contains(st.get(), "installing") {
			t.Errorf("a pulled build did not install again: %v", st.get())
		}
		if m.Digest != first.Digest {
			t.Errorf("the same declaration built again from the mirror: %s, want %s", m.Digest, first.Digest)
		}
		assertClean(t, s, stateDir)
	})

	t.Run("unknown package", func(t *testing.T) {
		bad := tpl
		bad.DebianPackages = []string{"jq", "stockade-no-such-package"}
		_, err := s.BuildTemplate(t.Context(), bad, opts(&stages{}))
		want := `debian_packages: package "stockade-no-such-package" does not exist in trixie`
		if msg, ok := errdefs.PublicMessage(err); !ok || !strings.Contains(msg, want) || !errdefs.IsInvalidArgument(err) {
			t.Errorf("got %v (public %q), want a public ErrInvalidArgument with %q", err, msg, want)
		}
		if img, _, err := s.ResolveTemplate("tools"); err != nil || img.Digest != first.Digest {
			t.Errorf("after a failed build the template is %s, %v; want %s", img.Digest, err, first.Digest)
		}
		assertClean(t, s, stateDir)
	})

	t.Run("failing start and ready", func(t *testing.T) {
		for _, c := range []struct{ start, ready, want string }{
			{"echo starting; exit 7", "", "start: "},
			{"true", "echo not ready >&2; false", "ready: "},
		} {
			bad := tpl
			bad.Name, bad.DebianPackages, bad.Start, bad.Ready = "broken", nil, c.start, c.ready
			_, err := s.BuildTemplate(t.Context(), bad, opts(&stages{}))
			msg, ok := errdefs.PublicMessage(err)
			if !ok || !strings.HasPrefix(msg, c.want) || !errdefs.IsInvalidArgument(err) {
				t.Errorf("start %q, ready %q: got %v, want a public error starting %q", c.start, c.ready, err, c.want)
			}
			if c.ready != "" && !strings.Contains(msg, "not ready") {
				t.Errorf("the ready error %q lacks its output", msg)
			}
		}
		if _, _, err := s.ResolveTemplate("broken"); !errdefs.IsNotFound(err) {
			t.Errorf("a template whose builds failed resolves: %v", err)
		}
		assertClean(t, s, stateDir)
	})

	var grown Manifest
	t.Run("package added", func(t *testing.T) {
		more := tpl
		more.DebianPackages = []string{"jq", "tree"}
		m, err := s.BuildTemplate(t.Context(), more, opts(&stages{logf: t.Logf}))
		if err != nil {
			t.Fatalf("BuildTemplate: %v", err)
		}
		grown = m
		if m.Digest == first.Digest || m.Template.Key == first.Template.Key || m.Template.Layer == first.Template.Layer {
			t.Errorf("adding a package kept digest %s, key or layer", m.Digest)
		}
		if m.Packages["tree"] == "" || !slices.Contains(m.Template.DebianAdded, "tree") {
			t.Errorf("tree missing from %v", m.Template.DebianAdded)
		}
	})

	t.Run("cancelled while apt runs", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		// Cancelled half a second into the install, while the build
		// sandbox runs apt-get.
		var once sync.Once
		st := &stages{on: func(p Progress) {
			if p.Stage == "installing" {
				once.Do(func() { time.AfterFunc(500*time.Millisecond, cancel) })
			}
		}}
		more := tpl
		more.DebianPackages = []string{"jq", "tree", "less"}
		_, err := s.BuildTemplate(ctx, more, opts(st))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
		if img, _, err := s.ResolveTemplate("tools"); err != nil || img.Digest != grown.Digest {
			t.Errorf("after a cancelled build the template is %s, %v; want %s", img.Digest, err, grown.Digest)
		}
		base, _ := s.Resolve("shell")
		if !slices.Contains(st.get(), "installing") {
			t.Errorf("the build ended before installing: %v", st.get())
		}
		if _, err := os.Stat(filepath.Join(s.layersDir(), layerKey(base.Digest, more.DebianPackages, config.DefaultMirror))); err == nil {
			t.Errorf("the cancelled build left a layer")
		}
		assertClean(t, s, stateDir)
	})

	t.Run("prune", func(t *testing.T) {
		// While a daemon holds the store, a sandbox of its may still run
		// the first build: a prune by hand is refused, and the daemon's
		// own keeps what its sandboxes use.
		release, err := s.Hold()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.PruneIdle(); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "daemon") {
			t.Errorf("PruneIdle while a daemon holds the store: got %v, want ErrFailedPrecondition naming the daemon", err)
		}
		pruned, err := s.Prune([]string{first.Digest})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(pruned, first.Digest) || !s.Has(first.Digest) {
			t.Errorf("Prune keeping the first build removed %v; want it kept", pruned)
		}
		release()
		// Once no sandbox uses it, it goes.
		pruned, err = s.PruneIdle()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(pruned, first.Digest) || slices.Contains(pruned, grown.Digest) || s.Has(first.Digest) {
			t.Errorf("Prune removed %v; want the first build %s and not the current %s", pruned, first.Digest, grown.Digest)
		}
		layers, _ := os.ReadDir(s.layersDir())
		if len(layers) != 1 || layers[0].Name() != grown.Template.Layer {
			t.Errorf("layers after Prune = %v, want only %s", layers, grown.Template.Layer)
		}
		if _, _, err := s.ResolveTemplate("tools"); err != nil {
			t.Errorf("ResolveTemplate after Prune: %v", err)
		}
		if _, err := s.Resolve("shell"); err != nil {
			t.Errorf("Resolve(shell) after Prune: %v", err)
		}
		if err := os.Chmod(s.root, fsmode.Traverse); err != nil {
			t.Fatal(err)
		}
		if bad := fsmode.Check(fsmode.Layout{DataDir: s.root}); len(bad) != 0 {
			t.Errorf("after the builds: got %q, want every path as fsmode says", bad)
		}
	})
}

// writerFunc is an io.Writer calling f.
type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

func TestAptError(t *testing.T) {
	tests := []struct {
		out, want string
		class     error
	}{
		{"Reading package lists...\nE: Unable to locate package nope\n", `debian_packages: package "nope" does not exist in trixie`, errdefs.ErrInvalidArgument},
		{"E: Version '9.9' for 'jq' was not found\n", `debian_packages: version "9.9" of package "jq" does not exist in trixie`, errdefs.ErrInvalidArgument},
		{"The following packages have unmet dependencies:\n a : Depends: b (>= 2) but 1 is to be installed\nE: Unable to correct problems, you have held broken packages.\n",
			"debian_packages: the packages conflict (a Depends b (>= 2) but 1 is to be installed)", errdefs.ErrInvalidArgument},
		{"E: Package 'x' has no installation candidate\n", `debian_packages: package "x" has no installable version in trixie`, errdefs.ErrInvalidArgument},
		{"E: Failed to fetch http://deb.debian.org/x  Could not resolve\n", "fetching from the Debian mirror", errdefs.ErrUnavailable},
		{"W: Download is performed unsandboxed as root as file '/x/partial/jq.deb' couldn't be accessed by user '_apt'. - pkgAcquire::Run (13: Permission denied)\n",
			"apt would download as root, not as _apt", errdefs.ErrFailedPrecondition},
		{"W: No sandbox user '_apt' on the system, can not drop privileges\n", "apt would download as root", errdefs.ErrFailedPrecondition},
		{"Reading package lists...\nDone\n", "", nil},
	}
	for _, tt := range tests {
		err := aptError(tt.out)
		if tt.want == "" {
			if err != nil {
				t.Errorf("aptError(%q) = %v, want nil", tt.out, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, tt.class) {
			t.Errorf("aptError(%q) = %v, want %q (%v)", tt.out, err, tt.want, tt.class)
		}
	}
}

// FuzzAptError feeds apt-get output (which carries the mirror's package
// names) to the parser.
func FuzzAptError(f *testing.F) {
	f.Add("E: Unable to locate package x\n")
	f.Add(" a : Depends: b\nE: Unable to correct problems\n")
	f.Add("'http://x/a_1_amd64.deb' a_1_amd64.deb 12 SHA256:00\n")
	f.Fuzz(func(t *testing.T, out string) {
		_ = aptError(out)
		n, size := countURIs(out)
		if n < 0 || (n == 0 && size != 0) {
			t.Errorf("countURIs = %d, %d", n, size)
		}
	})
}

func TestTemplateRuntimeStripsEveryManager(t *testing.T) {
	rt := templateRuntime(Runtimes["shell"])
	for _, p := range []string{"usr/bin/pip3*", "usr/bin/npm", "usr/bin/corepack"} {
		if !slices.Contains(rt.Strip, p) {
			t.Errorf("a shell template's strip list lacks %s: %v", p, rt.Strip)
		}
	}
	if len(Runtimes["shell"].Strip) != 0 {
		t.Errorf("templateRuntime changed the shell runtime")
	}
}

func TestCheckTree(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"clean", map[string]string{"usr/bin/jq": "x", "root/.profile": "x"}, ""},
		{"pip", map[string]string{"usr/local/bin/pip3.13": "x"}, "package manager at /usr/local/bin/pip3.13"},
		{"npx", map[string]string{"bin/npx": "x"}, "package manager at /bin/npx"},
		{"ssh", map[string]string{"root/.ssh/id_rsa": "x"}, "credentials at /root/.ssh"},
		{"aws", map[string]string{"home/u/.aws/credentials": "x"}, "credentials at /home/u/.aws"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, tt.files)
			err := checkTree(dir)
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("checkTree = %v, want %q", err, tt.want)
			}
		})
	}
	t.Run("setuid", func(t *testing.T) {
		dir := t.TempDir()
		writeTree(t, dir, map[string]string{"usr/bin/su": "x"})
		if err := os.Chmod(filepath.Join(dir, "usr/bin/su"), os.ModeSetuid|0o755); err != nil {
			t.Fatal(err)
		}
		if err := checkTree(dir); err == nil || !strings.Contains(err.Error(), "setuid") {
			t.Errorf("checkTree = %v, want a setuid error", err)
		}
	})
	for _, tt := range []struct {
		name string
		mode uint32
		want string
	}{
		{"fifo", syscall.S_IFIFO | 0o644, "a FIFO at /opt/node"},
		{"char device", syscall.S_IFCHR | 0o666, "a character device at /opt/node"},
		{"block device", syscall.S_IFBLK | 0o600, "a block device at /opt/node"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.mode&syscall.S_IFMT != syscall.S_IFIFO && os.Geteuid() != 0 {
				missing(t, "making a device node needs root")
			}
			dir := t.TempDir()
			writeTree(t, dir, map[string]string{"opt/x": "x"})
			if err := syscall.Mknod(filepath.Join(dir, "opt/node"), tt.mode, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
			if err := checkTree(dir); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("checkTree = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestClearPrivilegesCaps gives a file of a tree capabilities (as setcap
// cap_net_raw+ep does): hardening removes them.
func TestClearPrivilegesCaps(t *testing.T) {
	if os.Geteuid() != 0 {
		missing(t, "setting file capabilities needs root")
	}
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"usr/bin/ping": "x", "usr/bin/plain": "x"})
	ping := filepath.Join(dir, "usr/bin/ping")
	// struct vfs_cap_data, revision 2, effective: permitted CAP_NET_RAW.
	caps := make([]byte, 20)
	binary.LittleEndian.PutUint32(caps[0:], 0x02000001)
	binary.LittleEndian.PutUint32(caps[4:], 1<<13)
	if err := unix.Setxattr(ping, capsXattr, caps, 0); err != nil {
		missing(t, fmt.Sprintf("the temporary directory's file system takes no file capabilities: %v", err))
	}
	if _, err := unix.Getxattr(ping, capsXattr, nil); err != nil {
		t.Fatalf("the capabilities did not stick: %v", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := clearPrivileges(root); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Getxattr(ping, capsXattr, nil); !errors.Is(err, unix.ENODATA) {
		t.Errorf("after clearPrivileges, %s of /usr/bin/ping: %v, want none (ENODATA)", capsXattr, err)
	}
}

// missing skips t with reason, or fails it in CI (testenv.Missing, which
// this package's tests cannot import: testenv imports image).
func missing(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("missing in CI: %s", reason)
	}
	t.Skipf("skipping: %s", reason)
}

// TestBuildTemplateConcurrent starts two builds of one template at once:
// the store's lock serialises them, and the second finds the first's
// image.
func TestBuildTemplateConcurrent(t *testing.T) {
	requireTemplateBuild(t, "shell")
	s, data := templateStore(t, "shell")
	writeTree(t, data, map[string]string{"f": "x"})
	tpl := templates.Template{Name: "twice", Base: "shell", Files: []templates.File{{Source: filepath.Join(data, "f"), Target: "/opt/f"}}, Start: "test -r /opt/f"}
	st := &stages{}
	var wg sync.WaitGroup
	digests := make([]string, 2)
	for i := range digests {
		wg.Go(func() {
			m, err := s.BuildTemplate(t.Context(), tpl, TemplateOptions{StateDir: t.TempDir(), Progress: st.progress, Sources: TemplateSources{DataRoot: data}})
			if err != nil {
				t.Errorf("build %d: %v", i, err)
			}
			digests[i] = m.Digest
		})
	}
	wg.Wait()
	if digests[0] == "" || digests[0] != digests[1] {
		t.Errorf("the builds made %q", digests)
	}
	hashed := 0
	for _, s := range st.get() {
		if s == "hashing" {
			hashed++
		}
	}
	if hashed != 1 {
		t.Errorf("stages %v: %d builds hashed a tree, want 1", st.get(), hashed)
	}
	// The store's paths have the modes fsmode says (the root is the data
	// directory's, which set-up makes).
	if err := os.Chmod(s.root, fsmode.Traverse); err != nil {
		t.Fatal(err)
	}
	if bad := fsmode.Check(fsmode.Layout{DataDir: s.root}); len(bad) != 0 {
		t.Errorf("after a template build: got %q, want every path as fsmode says", bad)
	}
}

// TestBuildTemplateOutOfDisk builds a template in a store on a file
// system too small for the base image's tree.
func TestBuildTemplateOutOfDisk(t *testing.T) {
	requireTemplateBuild(t, "shell")
	root := t.TempDir()
	if err := syscall.Mount("tmpfs", root, "tmpfs", 0, "size=24m"); err != nil {
		missing(t, fmt.Sprintf("cannot mount a small tmpfs: %v", err))
	}
	t.Cleanup(func() { syscall.Unmount(root, syscall.MNT_DETACH) })
	installed := Open(installedStore())
	img, err := installed.Resolve("shell")
	if err != nil {
		t.Fatal(err)
	}
	s := Open(root)
	if err := os.MkdirAll(s.blobsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	hex := strings.TrimPrefix(img.Digest, "sha256:")
	if err := os.Symlink(installed.imageDir(hex), s.imageDir(hex)); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.refsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.writeRef("shell", img.Digest); err != nil {
		t.Fatal(err)
	}
	tpl := templates.Template{Name: "big", Base: "shell", Start: "true"}
	_, err = s.BuildTemplate(t.Context(), tpl, TemplateOptions{StateDir: t.TempDir()})
	msg, _ := errdefs.PublicMessage(err)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(msg, "out of disk space") {
		t.Errorf("got %v (public %q), want ErrResourceExhausted saying the disk is full", err, msg)
	}
	if ents, _ := os.ReadDir(s.tmpDir()); len(ents) != 0 {
		t.Errorf("the failed build left %d entries in %s", len(ents), s.tmpDir())
	}
	if _, _, err := s.ResolveTemplate("big"); !errdefs.IsNotFound(err) {
		t.Errorf("ResolveTemplate after a failed build: %v, want ErrNotFound", err)
	}
}

// TestBuildTemplateWithoutBase asks for a template whose base image was
// never built.
func TestBuildTemplateWithoutBase(t *testing.T) {
	s := Open(t.TempDir())
	_, err := s.BuildTemplate(t.Context(), templates.Template{Name: "analytics", Base: "python"}, TemplateOptions{})
	msg, ok := errdefs.PublicMessage(err)
	if !ok || !strings.Contains(msg, "build the python image first") || !errdefs.IsFailedPrecondition(err) {
		t.Errorf("got %v, want a public ErrFailedPrecondition saying to build the python image first", err)
	}
	if _, _, err := s.ResolveTemplate("analytics"); !errdefs.IsNotFound(err) {
		t.Errorf("ResolveTemplate = %v, want ErrNotFound", err)
	}
	if _, err := s.BuildTemplate(t.Context(), templates.Template{Name: "python", Base: "python"}, TemplateOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a template named after a runtime: %v, want ErrInvalidArgument", err)
	}
}

// TestBuildTemplateInterpreters builds a python template with a Debian
// python library and a node template, whose start and ready run with the
// base's interpreter in the build sandbox.
func TestBuildTemplateInterpreters(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping real template builds in -short mode")
	}
	tests := []struct {
		tpl  templates.Template
		bad  string // a Ready that fails
		want string // in its error
	}{
		{templates.Template{Name: "py", Base: "python", DebianPackages: []string{"python3-six"},
			Env: map[string]string{"MODE": "test"}, Start: "import os, six, numpy\nmode = os.environ['MODE']", Ready: "assert six.PY3 and mode == 'test'"},
			"assert mode == 'prod', 'wrong mode'", "AssertionError: wrong mode"},
		{templates.Template{Name: "js", Base: "node", Start: "globalThis.os = require('os')", Ready: "if (os.platform() !== 'linux') throw new Error('not linux')"},
			"if (os.platform() === 'linux') throw new Error('linux after all')", "Error: linux after all"},
	}
	for _, tt := range tests {
		t.Run(tt.tpl.Base, func(t *testing.T) {
			requireTemplateBuild(t, tt.tpl.Base)
			s, _ := templateStore(t, tt.tpl.Base)
			m, err := s.BuildTemplate(t.Context(), tt.tpl, TemplateOptions{StateDir: t.TempDir()})
			if err != nil {
				t.Fatalf("BuildTemplate: %v", err)
			}
			for _, p := range tt.tpl.DebianPackages {
				if m.Packages[p] == "" || !slices.Contains(m.Template.DebianAdded, p) {
					t.Errorf("%s missing from the SBOM %v", p, m.Template.DebianAdded)
				}
			}
			bad := tt.tpl
			bad.Ready = tt.bad
			_, err = s.BuildTemplate(t.Context(), bad, TemplateOptions{StateDir: t.TempDir()})
			if msg, _ := errdefs.PublicMessage(err); !strings.HasPrefix(msg, "ready: ") || !strings.Contains(msg, tt.want) {
				t.Errorf("a failing ready: %v, want a public error naming ready with %q", err, tt.want)
			}
			if img, _, err := s.ResolveTemplate(tt.tpl.Name); err != nil || img.Digest != m.Digest {
				t.Errorf("after the failed build: %s, %v; want %s", img.Digest, err, m.Digest)
			}
		})
	}
}

// makeWheel writes a pure-python wheel of the module stockadedemo to dir
// and returns its file name and hex SHA-256.
func makeWheel(t *testing.T, dir string) (string, string) {
	t.Helper()
	const file = "stockadedemo-1.0-py3-none-any.whl"
	files := []struct{ name, body string }{
		{"stockadedemo/__init__.py", "ANSWER = 42\n"},
		{"stockadedemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: stockadedemo\nVersion: 1.0\n"},
		{"stockadedemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var rec strings.Builder
	for _, f := range files {
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&rec, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	rec.WriteString("stockadedemo-1.0.dist-info/RECORD,,\n")
	files = append(files, struct{ name, body string }{"stockadedemo-1.0.dist-info/RECORD", rec.String()})
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.body))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return file, hex.EncodeToString(sum[:])
}

// TestBuildTemplateWheel builds a python template with a wheel from the
// operator's wheelhouse, which its start imports, and refuses a wheel
// whose hash is not the declared one.
func TestBuildTemplateWheel(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping real template builds in -short mode")
	}
	requireTemplateBuild(t, "python")
	s, wheelhouse := templateStore(t, "python")
	file, sum := makeWheel(t, wheelhouse)
	tpl := templates.Template{Name: "analytics", Base: "python",
		PythonWheels: []templates.Wheel{{File: file, SHA256: sum}},
		Start:        "import stockadedemo", Ready: "assert stockadedemo.ANSWER == 42"}
	st := &stages{}
	opts := TemplateOptions{StateDir: t.TempDir(), Sources: TemplateSources{Wheelhouse: wheelhouse}, Progress: st.progress}
	m, err := s.BuildTemplate(t.Context(), tpl, opts)
	if err != nil {
		t.Fatalf("BuildTemplate: %v", err)
	}
	if !slices.Contains(st.get(), "wheels") {
		t.Errorf("stages %v lack wheels", st.get())
	}
	if len(m.Template.Wheels) != 1 || m.Template.Wheels[0] != (TemplateWheel{Name: "stockadedemo", Version: "1.0", SHA256: sum}) {
		t.Errorf("wheels = %+v", m.Template.Wheels)
	}
	img, _, err := s.ResolveTemplate("analytics")
	if err != nil {
		t.Fatal(err)
	}
	py, err := pythonVersion(img.Rootfs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(img.Rootfs, "usr/local/lib", py, "dist-packages/stockadedemo/__init__.py")); err != nil {
		t.Errorf("the wheel is not in dist-packages: %v", err)
	}

	bad := tpl
	bad.PythonWheels = []templates.Wheel{{File: file, SHA256: strings.Repeat("0", 64)}}
	_, err = s.BuildTemplate(t.Context(), bad, opts)
	if msg, _ := errdefs.PublicMessage(err); !strings.HasPrefix(msg, "python_wheels: ") {
		t.Errorf("a wheel with another hash: %v, want a public error naming python_wheels", err)
	}
	if now, _, err := s.ResolveTemplate("analytics"); err != nil || now.Digest != m.Digest {
		t.Errorf("after the failed build: %s, %v; want %s", now.Digest, err, m.Digest)
	}
}

func TestCheckTarget(t *testing.T) {
	for target, ok := range map[string]bool{
		"/opt/m.json": true, "/etc/tools": true, "/": false, "opt/x": false, "/opt/../etc": false,
		"/tmp/x": false, "/workspace": false, "/proc/x": false, "/.stockade/guest": false, "/etc/stockade/template.json": false,
	} {
		if err := checkTarget(target); (err == nil) != ok || (err != nil && !strings.HasPrefix(err.Error(), "files: ")) {
			t.Errorf("checkTarget(%q) = %v, want ok %v", target, err, ok)
		}
	}
}

func TestHashFilesRefusesLinks(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"ok/a": "a", "linked/a": "a", "linked/passwd": "-> /etc/passwd", "top": "-> ok", "out": "-> /etc"})
	if files, err := hashFiles(dir, []templates.File{{Source: filepath.Join(dir, "ok"), Target: "/opt/ok"}}); err != nil || len(files) != 2 {
		t.Errorf("hashFiles(ok) = %v, %v; want the directory and its file", files, err)
	}
	// A source that is a link, even one inside the data root, is refused
	// as the declaration's check refuses it (internal/dataroot): what is
	// copied is what the operator's paths hold.
	for _, src := range []string{"top", "linked", "out"} {
		_, err := hashFiles(dir, []templates.File{{Source: filepath.Join(dir, src), Target: "/opt/x"}})
		if msg, _ := errdefs.PublicMessage(err); !strings.HasPrefix(msg, "files: ") {
			t.Errorf("hashFiles(%s) = %v, want a public error naming files", src, err)
		}
	}
}

// TestFilesSwappedParent swaps a parent directory of a file source for a
// link to a host directory holding the same names, before the build
// hashes the source and between the hashing and the copy: the build
// refuses it each time, and never reads the host's files.
func TestFilesSwappedParent(t *testing.T) {
	setup := func(t *testing.T) (data, host string, files []templates.File) {
		data, host = t.TempDir(), t.TempDir()
		writeTree(t, data, map[string]string{"sub/conf/a": "same"})
		writeTree(t, host, map[string]string{"conf/a": "same"})
		return data, host, []templates.File{{Source: filepath.Join(data, "sub/conf"), Target: "/opt/conf"}}
	}
	swap := func(t *testing.T, data, host string) {
		if err := os.RemoveAll(filepath.Join(data, "sub")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(host, filepath.Join(data, "sub")); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("before hashing", func(t *testing.T) {
		data, host, files := setup(t)
		swap(t, data, host)
		got, err := hashFiles(data, files)
		if msg, _ := errdefs.PublicMessage(err); !strings.Contains(msg, "outside the data root") {
			t.Errorf("hashFiles = %v, %v; want an error saying the source is outside the data root", got, err)
		}
	})
	t.Run("while walking", func(t *testing.T) {
		data, host, files := setup(t)
		root, _, err := openDataRoot(data)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		rel, err := sourceRel(data, files[0].Source)
		if err != nil {
			t.Fatal(err)
		}
		swap(t, data, host)
		if got, err := hashSource(root, rel, files[0]); err == nil {
			t.Errorf("hashSource after the swap = %v; want an error", got)
		}
	})
	t.Run("before copying", func(t *testing.T) {
		data, host, files := setup(t)
		in, err := hashFiles(data, files)
		if err != nil || len(in) != 2 {
			t.Fatalf("hashFiles = %v, %v; want the directory and its file", in, err)
		}
		swap(t, data, host)
		root, _, err := openDataRoot(data)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		tree, err := os.OpenRoot(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer tree.Close()
		if err := copyInto(root, tree, "a", in[1]); err == nil {
			t.Errorf("copyInto after the swap copied %s; want an error", in[1].src)
		}
	})
	t.Run("no data root", func(t *testing.T) {
		_, _, files := setup(t)
		_, err := hashFiles("", files)
		if msg, _ := errdefs.PublicMessage(err); !errdefs.IsFailedPrecondition(err) || !strings.Contains(msg, "no data root") {
			t.Errorf("hashFiles without a data root = %v, want a failed precondition saying so", err)
		}
		if got, err := hashFiles("", nil); err != nil || len(got) != 0 {
			t.Errorf("hashFiles without files or data root = %v, %v; want none", got, err)
		}
	})
}
