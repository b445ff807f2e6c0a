package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/fsmode"
)

// writeTree writes files under dir: a name ending in "/" is a directory,
// content "-> x" is a symlink to x.
func writeTree(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if strings.HasSuffix(name, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "-> "); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeRootfs writes a tiny Debian-like tree for rt: merged /usr, the
// accounts, a dpkg database listing rt's packages, the interpreter, and the
// build leftovers harden must remove. extra is written into every file that
// names it, so that two fake trees can differ.
func fakeRootfs(t testing.TB, rootfs string, rt Runtime, extra string) {
	t.Helper()
	var status strings.Builder
	for _, p := range append([]string{"base-files"}, rt.Packages...) {
		fmt.Fprintf(&status, "Package: %s\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.0-%s\nDescription: fake\n multi-line\n\n", p, p)
	}
	status.WriteString("Package: removed-pkg\nStatus: deinstall ok config-files\nVersion: 9\n\n")
	writeTree(t, rootfs, map[string]string{
		"bin":                                 "-> usr/bin",
		"usr/bin/busybox":                     "busybox " + extra,
		"usr/bin/python3":                     "-> python3.13",
		"usr/bin/python3.13":                  "python",
		"usr/bin/node":                        "node",
		"usr/bin/npm":                         "npm",
		"usr/bin/pip3":                        "pip",
		"usr/bin/su":                          "su",
		"usr/lib/python3.13/ensurepip/a.py":   "ensurepip",
		"usr/lib/python3/dist-packages/pip/x": "pip",
		"usr/lib/node_modules/npm/index.js":   "npm",
		"etc/passwd":                          "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"etc/group":                           "root:x:0:\nnogroup:x:65534:\n",
		"etc/shadow":                          "root:*:20123:0:99999:7:::\nnobody:*:20123:0:99999:7:::\n",
		"etc/hostname":                        "buildhost\n",
		"etc/resolv.conf":                     "nameserver 10.0.0.1\n",
		"var/lib/dpkg/status":                 status.String(),
		"var/lib/dpkg/status-old":             "old",
		"var/log/dpkg.log":                    "log " + time.Now().String(),
		"var/log/apt/history.log":             "log",
		"var/cache/apt/pkgcache.bin":          "cache",
		"var/lib/apt/lists/deb_Packages":      "list",
		"tmp/build-leftover":                  "x",
		"proc/":                               "",
	})
	for _, p := range []string{"usr/bin/busybox", "usr/bin/python3.13", "usr/bin/node"} {
		if err := os.Chmod(filepath.Join(rootfs, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(rootfs, "usr/bin/su"), fs.ModeSetuid|fs.ModeSetgid|0o755); err != nil {
		t.Fatal(err)
	}
}

// fakeStore is a store in a temporary directory whose bootstrap writes a
// fake tree and counts its calls.
type fakeStore struct {
	*Store
	calls atomic.Int32
	// extra distinguishes the trees of successive builds; same extra, same
	// digest.
	extra string
	// fail, if set, runs instead of writing the tree.
	fail func(ctx context.Context, rootfs string) error
}

func newFakeStore(t testing.TB) *fakeStore {
	t.Helper()
	f := &fakeStore{Store: Open(t.TempDir())}
	f.bootstrap = func(ctx context.Context, rootfs string, rt Runtime, opts BuildOptions) error {
		f.calls.Add(1)
		if f.fail != nil {
			return f.fail(ctx, rootfs)
		}
		fakeRootfs(t, rootfs, rt, f.extra)
		return nil
	}
	return f
}

func (f *fakeStore) mustBuild(t testing.TB, name string, opts BuildOptions) Manifest {
	t.Helper()
	m, err := f.Build(t.Context(), name, opts)
	if err != nil {
		t.Fatalf("Build(%q): %v", name, err)
	}
	return m
}

func digestOf(t *testing.T, dir string) string {
	t.Helper()
	sum, err := treeDigest(t.Context(), dir)
	if err != nil {
		t.Fatalf("treeDigest: %v", err)
	}
	return sum.hex
}

func TestTreeDigest(t *testing.T) {
	base := map[string]string{
		"etc/passwd":   "root:x:0:0::/root:/bin/sh\n",
		"usr/bin/tool": "#!/bin/sh\necho hi\n",
		"bin":          "-> usr/bin",
		"empty/":       "",
	}
	baseline := t.TempDir()
	writeTree(t, baseline, base)
	want := digestOf(t, baseline)

	tests := []struct {
		name    string
		mutate  func(t *testing.T, dir string)
		changes bool
	}{
		{"same tree, other times", func(t *testing.T, dir string) {
			old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
			for _, p := range []string{"etc/passwd", "usr/bin/tool", "empty", "."} {
				if err := os.Chtimes(filepath.Join(dir, p), old, old); err != nil {
					t.Fatal(err)
				}
			}
		}, false},
		{"content", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "usr/bin/tool"), []byte("#!/bin/sh\necho ho\n"), 0o644)
		}, true},
		{"mode", func(t *testing.T, dir string) {
			os.Chmod(filepath.Join(dir, "usr/bin/tool"), 0o755)
		}, true},
		{"setuid bit", func(t *testing.T, dir string) {
			os.Chmod(filepath.Join(dir, "usr/bin/tool"), fs.ModeSetuid|0o644)
		}, true},
		{"symlink target", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "bin"))
			os.Symlink("/usr/bin", filepath.Join(dir, "bin"))
		}, true},
		{"rename", func(t *testing.T, dir string) {
			os.Rename(filepath.Join(dir, "usr/bin/tool"), filepath.Join(dir, "usr/bin/tool2"))
		}, true},
		{"empty file added", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "empty/f"), nil, 0o644)
		}, true},
		{"empty dir replaced by empty file", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "empty"))
			os.WriteFile(filepath.Join(dir, "empty"), nil, 0o755)
		}, true},
		{"owner", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("changing the owner of a file needs root")
			}
			os.Lchown(filepath.Join(dir, "etc/passwd"), 65534, 65534)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, base)
			tt.mutate(t, dir)
			got := digestOf(t, dir)
			if tt.changes && got == want {
				t.Errorf("digest did not change: %s", got)
			}
			if !tt.changes && got != want {
				t.Errorf("got digest %s, want %s", got, want)
			}
		})
	}
}

func TestTreeDigestSize(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a": "12345", "b/c": "123", "l": "-> a"})
	if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "hard")); err != nil {
		t.Fatal(err)
	}
	sum, err := treeDigest(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if sum.size != 8 {
		t.Errorf("got size %d, want 8 (hard link counted once)", sum.size)
	}
}

func TestResolve(t *testing.T) {
	tests := []struct {
		name     string
		runtime  string
		damage   func(t *testing.T, s *fakeStore, dir string) // dir is the image directory
		noBuild  bool
		wantErr  func(error) bool
		wantText string
	}{
		{name: "valid", runtime: "python"},
		{name: "valid shell through /bin symlink", runtime: "shell"},
		{name: "unknown runtime", runtime: "ruby", noBuild: true,
			wantErr: errdefs.IsInvalidArgument, wantText: "node, python, shell"},
		{name: "not built", runtime: "python", noBuild: true,
			wantErr: errdefs.IsNotFound, wantText: `run "stockade image build python" (or "stockade setup")`},
		{name: "manifest unreadable", runtime: "python",
			damage: func(t *testing.T, s *fakeStore, dir string) {
				os.WriteFile(filepath.Join(dir, "manifest.json"), []byte("{not json"), 0o644)
			},
			wantErr: errdefs.IsFailedPrecondition, wantText: `stockade image build --force python`},
		{name: "manifest missing", runtime: "node",
			damage: func(t *testing.T, s *fakeStore, dir string) {
				os.Remove(filepath.Join(dir, "manifest.json"))
			},
			wantErr: errdefs.IsFailedPrecondition, wantText: `stockade image build --force node`},
		{name: "manifest digest mismatch", runtime: "python",
			damage: func(t *testing.T, s *fakeStore, dir string) {
				editManifest(t, dir, func(m *Manifest) { m.Digest = "sha256:" + strings.Repeat("0", 64) })
			},
			wantErr: errdefs.IsFailedPrecondition, wantText: "does not match directory"},
		{name: "ref not a digest", runtime: "python",
			damage: func(t *testing.T, s *fakeStore, dir string) {
				os.WriteFile(filepath.Join(s.refsDir(), "python"), []byte("latest\n"), 0o644)
			},
			wantErr: errdefs.IsFailedPrecondition, wantText: "not a sha256 digest"},
		{name: "image directory gone", runtime: "python",
			damage: func(t *testing.T, s *fakeStore, dir string) {
				os.RemoveAll(dir)
			},
			wantErr: errdefs.IsFailedPrecondition, wantText: `stockade image build --force python`},
		{name: "rootfs gone", runtime: "python",
			damage: func(t *testing.T, s *fakeStore, dir string) {
				os.RemoveAll(filepath.Join(dir, "rootfs"))
			},
			wantErr: errdefs.IsFailedPrecondition, wantText: "rootfs"},
		{name: "interpreter deleted", runtime: "python",
			damage: func(t *testing.T, s *fakeStore, dir string) {
				os.Remove(filepath.Join(dir, "rootfs/usr/bin/python3.13"))
			},
			wantErr: errdefs.IsFailedPrecondition, wantText: "interpreter /usr/bin/python3"},
		{name: "interpreter not executable", runtime: "shell",
			damage: func(t *testing.T, s *fakeStore, dir string) {
				os.Chmod(filepath.Join(dir, "rootfs/usr/bin/busybox"), 0o644)
			},
			wantErr: errdefs.IsFailedPrecondition, wantText: "not an executable file"},
		{name: "interpreter escapes through absolute symlink", runtime: "node",
			damage: func(t *testing.T, s *fakeStore, dir string) {
				// /usr/bin/node -> /bin/sh exists on the host but not in
				// the image: resolving must stay inside the rootfs.
				p := filepath.Join(dir, "rootfs/usr/bin/node")
				os.Remove(p)
				os.Symlink("/bin/sh", p)
			},
			wantErr: errdefs.IsFailedPrecondition, wantText: "interpreter /usr/bin/node"},
		{name: "guest mount point deleted", runtime: "python",
			damage: func(t *testing.T, s *fakeStore, dir string) {
				os.Remove(filepath.Join(dir, "rootfs", GuestPath))
			},
			wantErr: errdefs.IsFailedPrecondition, wantText: "guest mount point"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFakeStore(t)
			var m Manifest
			if !tt.noBuild {
				m = s.mustBuild(t, tt.runtime, BuildOptions{})
				// Resolved once before the damage, as a daemon resolves
				// an image before every sandbox: what it remembers of
				// the image must not hide the damage.
				if _, err := s.Resolve(tt.runtime); err != nil {
					t.Fatalf("Resolve before the damage: %v", err)
				}
			}
			if tt.damage != nil {
				tt.damage(t, s, s.imageDir(strings.TrimPrefix(m.Digest, "sha256:")))
			}
			img, err := s.Resolve(tt.runtime)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Resolve: %v", err)
				}
				if img.Name != tt.runtime || img.Digest != m.Digest || !filepath.IsAbs(img.Rootfs) {
					t.Errorf("got %+v, want name %q, digest %s, absolute rootfs", img, tt.runtime, m.Digest)
				}
				if fi, err := os.Stat(img.Rootfs); err != nil || !fi.IsDir() {
					t.Errorf("rootfs %s is not a directory: %v", img.Rootfs, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Resolve succeeded, want an error")
			}
			if !tt.wantErr(err) {
				t.Errorf("got error %v, want another class", err)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("got error %q, want it to contain %q", err, tt.wantText)
			}
		})
	}
}

func editManifest(t *testing.T, dir string, edit func(*Manifest)) {
	t.Helper()
	p := filepath.Join(dir, "manifest.json")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(&m)
	data, _ = json.Marshal(m)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBuildIdempotent(t *testing.T) {
	s := newFakeStore(t)
	first := s.mustBuild(t, "python", BuildOptions{})
	second := s.mustBuild(t, "python", BuildOptions{})
	if n := s.calls.Load(); n != 1 {
		t.Errorf("got %d bootstraps after two builds, want 1", n)
	}
	if second.Digest != first.Digest || !second.Created.Equal(first.Created) {
		t.Errorf("second build returned %s (%v), want the first image %s (%v)", second.Digest, second.Created, first.Digest, first.Created)
	}

	// A forced rebuild of the same tree keeps the image and its manifest.
	again := s.mustBuild(t, "python", BuildOptions{Force: true})
	if n := s.calls.Load(); n != 2 {
		t.Errorf("got %d bootstraps after a forced build, want 2", n)
	}
	if again.Digest != first.Digest {
		t.Errorf("got digest %s for the same tree, want %s", again.Digest, first.Digest)
	}

	// A forced rebuild of another tree moves the ref and keeps the old
	// image until Prune.
	s.extra = "v2"
	changed := s.mustBuild(t, "python", BuildOptions{Force: true})
	if changed.Digest == first.Digest {
		t.Fatalf("got the same digest %s for a different tree", changed.Digest)
	}
	if img, err := s.Resolve("python"); err != nil || img.Digest != changed.Digest {
		t.Errorf("Resolve = %v, %v; want digest %s", img.Digest, err, changed.Digest)
	}
	if _, err := os.Stat(s.imageDir(strings.TrimPrefix(first.Digest, "sha256:"))); err != nil {
		t.Errorf("old image removed by the rebuild: %v", err)
	}
	pruned, err := s.Prune(nil)
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if !slices.Equal(pruned, []string{first.Digest}) {
		t.Errorf("Prune removed %v, want [%s]", pruned, first.Digest)
	}
	if _, err := s.Resolve("python"); err != nil {
		t.Errorf("Resolve after Prune: %v", err)
	}
}

func TestBuildRepairsDamagedImage(t *testing.T) {
	s := newFakeStore(t)
	m := s.mustBuild(t, "shell", BuildOptions{})
	dir := s.imageDir(strings.TrimPrefix(m.Digest, "sha256:"))
	// Same-size change: only a full hash notices it.
	if err := os.WriteFile(filepath.Join(dir, "rootfs/etc/group"), []byte("root:x:0:\nnogroup:x:65535:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(t.Context(), "shell"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Verify of a changed image = %v, want ErrFailedPrecondition", err)
	}
	// The tree is fine by the cheap checks, so only --force rebuilds it.
	s.mustBuild(t, "shell", BuildOptions{})
	if n := s.calls.Load(); n != 1 {
		t.Errorf("got %d bootstraps, want 1", n)
	}
	s.mustBuild(t, "shell", BuildOptions{Force: true})
	if err := s.Verify(t.Context(), "shell"); err != nil {
		t.Errorf("Verify after forced rebuild: %v", err)
	}
}

func TestBuildFailureLeavesNothing(t *testing.T) {
	tests := []struct {
		name    string
		fail    func(ctx context.Context, rootfs string) error
		cancel  bool
		wantErr func(error) bool
	}{
		{name: "bootstrap error", fail: func(ctx context.Context, rootfs string) error {
			os.WriteFile(filepath.Join(rootfs, "partial"), []byte("x"), 0o644)
			return fmt.Errorf("mirror unreachable: %w", errdefs.ErrUnavailable)
		}, wantErr: errdefs.IsUnavailable},
		{name: "no nobody user", fail: func(ctx context.Context, rootfs string) error {
			fakeRootfs(t, rootfs, Runtimes["python"], "")
			return os.WriteFile(filepath.Join(rootfs, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644)
		}, wantErr: errdefs.IsFailedPrecondition},
		{name: "package missing", fail: func(ctx context.Context, rootfs string) error {
			fakeRootfs(t, rootfs, Runtime{Packages: []string{"python3"}}, "")
			return nil
		}, wantErr: errdefs.IsFailedPrecondition},
		{name: "cancelled", cancel: true, fail: func(ctx context.Context, rootfs string) error {
			fakeRootfs(t, rootfs, Runtimes["python"], "")
			<-ctx.Done()
			return ctx.Err()
		}, wantErr: func(err error) bool { return errors.Is(err, context.Canceled) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFakeStore(t)
			prev := s.mustBuild(t, "python", BuildOptions{})
			s.fail = tt.fail
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tt.cancel {
				time.AfterFunc(50*time.Millisecond, cancel)
			}
			_, err := s.Build(ctx, "python", BuildOptions{Force: true})
			if err == nil || !tt.wantErr(err) {
				t.Fatalf("got error %v, want another", err)
			}
			if got, _ := s.readRef("python"); got != prev.Digest {
				t.Errorf("ref changed to %q, want %s", got, prev.Digest)
			}
			if ents, _ := os.ReadDir(s.tmpDir()); len(ents) != 0 {
				t.Errorf("left %d entries in %s, want none", len(ents), s.tmpDir())
			}
			if ents, _ := os.ReadDir(s.blobsDir()); len(ents) != 1 {
				t.Errorf("got %d images, want only the previous one", len(ents))
			}
			if _, err := s.Resolve("python"); err != nil {
				t.Errorf("previous image no longer resolves: %v", err)
			}
		})
	}
}

func TestBuildFailureWithoutPreviousImage(t *testing.T) {
	s := newFakeStore(t)
	s.fail = func(ctx context.Context, rootfs string) error { return errors.New("boom") }
	if _, err := s.Build(t.Context(), "node", BuildOptions{}); err == nil {
		t.Fatal("Build succeeded, want an error")
	}
	if _, err := os.Stat(filepath.Join(s.refsDir(), "node")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ref exists after a failed first build: %v", err)
	}
	if _, err := s.Resolve("node"); !errdefs.IsNotFound(err) {
		t.Errorf("Resolve = %v, want ErrNotFound", err)
	}
}

func TestBuildCleansStaleBuilds(t *testing.T) {
	s := newFakeStore(t)
	writeTree(t, s.tmpDir(), map[string]string{"python-123/rootfs/etc/passwd": "x"})
	writeTree(t, s.refsDir(), map[string]string{".python.tmp-99": "sha256:x"})
	s.mustBuild(t, "python", BuildOptions{})
	if ents, _ := os.ReadDir(s.tmpDir()); len(ents) != 0 {
		t.Errorf("left %d entries in %s, want none", len(ents), s.tmpDir())
	}
	if _, err := os.Stat(filepath.Join(s.refsDir(), ".python.tmp-99")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stale ref temp file kept: %v", err)
	}
}

func TestBuildConcurrent(t *testing.T) {
	s := newFakeStore(t)
	var wg sync.WaitGroup
	digests := make([]string, 4)
	for i := range digests {
		wg.Go(func() {
			m, err := s.Build(t.Context(), "node", BuildOptions{})
			if err != nil {
				t.Errorf("Build: %v", err)
			}
			digests[i] = m.Digest
		})
	}
	wg.Wait()
	if n := s.calls.Load(); n != 1 {
		t.Errorf("got %d bootstraps for 4 concurrent builds, want 1", n)
	}
	for _, d := range digests[1:] {
		if d != digests[0] {
			t.Errorf("got digests %v, want all equal", digests)
			break
		}
	}
}

func TestBuildInvalidArguments(t *testing.T) {
	s := newFakeStore(t)
	for _, tt := range []struct {
		name, runtime, mirror string
	}{
		{"unknown runtime", "ruby", ""},
		{"option as mirror", "shell", "--foreign"},
		{"relative mirror", "shell", "deb.debian.org/debian"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Build(t.Context(), tt.runtime, BuildOptions{Mirror: tt.mirror})
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("got %v, want ErrInvalidArgument", err)
			}
		})
	}
	if n := s.calls.Load(); n != 0 {
		t.Errorf("got %d bootstraps, want 0", n)
	}
}

func TestHarden(t *testing.T) {
	tests := []struct {
		runtime string
		absent  []string
		present []string
	}{
		{"python",
			[]string{"usr/lib/python3.13/ensurepip", "usr/lib/python3/dist-packages/pip", "usr/bin/pip3"},
			[]string{"usr/bin/npm", "usr/bin/python3.13"}},
		{"node",
			[]string{"usr/bin/npm", "usr/lib/node_modules/npm"},
			[]string{"usr/bin/pip3", "usr/bin/node"}},
		{"shell", nil, []string{"usr/bin/busybox"}},
	}
	common := []string{"var/log/dpkg.log", "var/log/apt", "var/cache/apt/pkgcache.bin",
		"var/lib/apt/lists/deb_Packages", "var/lib/dpkg/status-old", "tmp/build-leftover"}
	for _, tt := range tests {
		t.Run(tt.runtime, func(t *testing.T) {
			s := newFakeStore(t)
			s.mustBuild(t, tt.runtime, BuildOptions{})
			img, err := s.Resolve(tt.runtime)
			if err != nil {
				t.Fatal(err)
			}
			r := img.Rootfs
			for _, p := range append(tt.absent, common...) {
				if _, err := os.Lstat(filepath.Join(r, p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("/%s exists (%v), want it removed", p, err)
				}
			}
			for _, p := range append(tt.present, "var/log", "var/lib/apt/lists") {
				if _, err := os.Lstat(filepath.Join(r, p)); err != nil {
					t.Errorf("/%s: %v, want it kept", p, err)
				}
			}
			for d, want := range map[string]fs.FileMode{
				"/tmp": 0o777 | fs.ModeSticky, "/workspace": 0o777 | fs.ModeSticky,
				"/proc": 0o755, "/sys": 0o755, "/dev": 0o755, "/.stockade": 0o755,
			} {
				fi, err := os.Lstat(filepath.Join(r, d))
				if err != nil || !fi.IsDir() || fi.Mode()&(fs.ModePerm|fs.ModeSticky) != want {
					t.Errorf("%s: %v, %v; want a directory with mode %v", d, fi.Mode(), err, want)
				}
			}
			fi, err := os.Lstat(filepath.Join(r, GuestPath))
			if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o555 || fi.Size() != 0 {
				t.Errorf("%s: %v, %v; want an empty regular file with mode 0555", GuestPath, fi.Mode(), err)
			}
			if fi, err := os.Stat(filepath.Join(r, "usr/bin/su")); err != nil || fi.Mode()&fs.ModeSetuid != 0 {
				t.Errorf("/usr/bin/su: %v, %v; want the setuid bit cleared", fi.Mode(), err)
			}
			for file, want := range map[string]string{
				"etc/hostname":    "sandbox\n",
				"etc/resolv.conf": "",
				"etc/shadow":      "root:*::0:99999:7:::\nnobody:*::0:99999:7:::\n",
			} {
				if got, _ := os.ReadFile(filepath.Join(r, file)); string(got) != want {
					t.Errorf("/%s = %q, want %q", file, got, want)
				}
			}
		})
	}
}

func TestManifest(t *testing.T) {
	s := newFakeStore(t)
	m := s.mustBuild(t, "python", BuildOptions{})
	data, err := os.ReadFile(filepath.Join(s.imageDir(strings.TrimPrefix(m.Digest, "sha256:")), "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "digest", "digest_format", "created", "suite", "mirror", "packages", "interpreter", "definition", "size_bytes"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("manifest has no %q", k)
		}
	}
	wantPkgs := map[string]string{"base-files": "1.0-base-files"}
	for _, p := range Runtimes["python"].Packages {
		wantPkgs[p] = "1.0-" + p
	}
	if fmt.Sprint(m.Packages) != fmt.Sprint(wantPkgs) {
		t.Errorf("got packages %v, want %v", m.Packages, wantPkgs)
	}
	if m.Suite != Suite || m.Mirror != config.DefaultMirror || m.Name != "python" || m.SizeBytes == 0 || m.Created.IsZero() {
		t.Errorf("got manifest %+v", m)
	}
	ref, _ := os.ReadFile(filepath.Join(s.refsDir(), "python"))
	if string(ref) != m.Digest+"\n" {
		t.Errorf("ref holds %q, want %q", ref, m.Digest+"\n")
	}
}

func TestListAndVerify(t *testing.T) {
	s := newFakeStore(t)
	if list, err := s.List(); err != nil || len(list) != 0 {
		t.Fatalf("List of an empty store = %v, %v; want nothing", list, err)
	}
	s.mustBuild(t, "shell", BuildOptions{})
	py := s.mustBuild(t, "python", BuildOptions{})
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range list {
		names = append(names, m.Name)
	}
	if !slices.Equal(names, []string{"python", "shell"}) {
		t.Errorf("List names = %v, want [python shell]", names)
	}
	for _, n := range []string{"python", "shell"} {
		if err := s.Verify(t.Context(), n); err != nil {
			t.Errorf("Verify(%q): %v", n, err)
		}
	}
	if err := s.Verify(t.Context(), "node"); !errdefs.IsNotFound(err) {
		t.Errorf("Verify of an unbuilt image = %v, want ErrNotFound", err)
	}

	os.Remove(filepath.Join(s.imageDir(strings.TrimPrefix(py.Digest, "sha256:")), "rootfs/usr/bin/python3.13"))
	list, err = s.List()
	if len(list) != 1 || list[0].Name != "shell" || !errdefs.IsFailedPrecondition(err) {
		t.Errorf("List with a damaged image = %v, %v; want shell and ErrFailedPrecondition", list, err)
	}
}

func TestRemove(t *testing.T) {
	s := newFakeStore(t)
	m := s.mustBuild(t, "node", BuildOptions{})
	if err := s.Remove("node"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve("node"); !errdefs.IsNotFound(err) {
		t.Errorf("Resolve after Remove = %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(s.imageDir(strings.TrimPrefix(m.Digest, "sha256:"))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("image directory kept after Remove: %v", err)
	}
	if err := s.Remove("node"); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

func TestResolveInRoot(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"usr/bin/real": "x",
		"bin":          "-> usr/bin",
		"abs":          "-> /usr/bin/real",
		"up":           "-> ../../../usr/bin/real",
		"loop":         "-> loop",
	})
	tests := []struct {
		path, want string
	}{
		{"/bin/real", "usr/bin/real"},
		{"/abs", "usr/bin/real"},
		{"/up", "usr/bin/real"},
		{"/../../usr/bin/real", "usr/bin/real"},
	}
	for _, tt := range tests {
		got, err := resolveInRoot(root, tt.path)
		if err != nil || got != filepath.Join(root, tt.want) {
			t.Errorf("resolveInRoot(%q) = %q, %v; want %q", tt.path, got, err, filepath.Join(root, tt.want))
		}
	}
	if _, err := resolveInRoot(root, "/loop"); err == nil {
		t.Errorf("resolveInRoot(/loop) succeeded, want an error")
	}
}

func TestInstalledPackages(t *testing.T) {
	status := "Package: a\nStatus: install ok installed\nVersion: 1\n\n" +
		"Package: b\nStatus: deinstall ok config-files\nVersion: 2\n\n" +
		"Package: c\nArchitecture: amd64\nStatus: install ok installed\nVersion: 3\nDescription: x\n Version: 9\n\n" +
		"Package: c\nArchitecture: i386\nStatus: install ok installed\nVersion: 3\n"
	got, err := installedPackages([]byte(status))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "1", "c:amd64": "3", "c:i386": "3"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if _, err := installedPackages(nil); err == nil {
		t.Errorf("empty status parsed, want an error")
	}
}

func TestRuntimeNames(t *testing.T) {
	names := Names()
	if len(names) != len(Runtimes) {
		t.Fatalf("Names() = %v, want every runtime of Runtimes", names)
	}
	for _, n := range names {
		rt, ok := Runtimes[n]
		if !ok || rt.Name != n || len(rt.Interpreter) == 0 || len(rt.Packages) == 0 {
			t.Errorf("runtime %q is incomplete: %+v", n, rt)
		}
	}
}

func BenchmarkResolve(b *testing.B) {
	s := newFakeStore(b)
	s.mustBuild(b, "python", BuildOptions{})
	for b.Loop() {
		if _, err := s.Resolve("python"); err != nil {
			b.Fatal(err)
		}
	}
}

// requireRealBuild skips the test unless real debootstrap builds can run
// here; with CI=true it fails instead, since CI must provide them.
func requireRealBuild(t *testing.T) {
	t.Helper()
	var reason string
	switch {
	case os.Geteuid() != 0:
		reason = "debootstrap needs root"
	default:
		if _, err := exec.LookPath("/usr/sbin/debootstrap"); err != nil {
			reason = "debootstrap is not installed (apt-get install debootstrap)"
		}
	}
	if reason == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("cannot build a real image: %s", reason)
	}
	t.Skipf("skipping: %s", reason)
}

// TestBuildShellDebootstrap builds the shell image with the real debootstrap
// from the Debian mirror (about a minute) and runs its interpreter.
func TestBuildShellDebootstrap(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the real debootstrap build in -short mode")
	}
	requireRealBuild(t)
	s := Open(t.TempDir())
	var (
		log    bytes.Buffer
		mu     sync.Mutex
		stages []string
		sized  bool // a size reported during debootstrap
	)
	start := time.Now()
	m, err := s.Build(t.Context(), "shell", BuildOptions{Log: &log, Progress: func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		if len(stages) == 0 || stages[len(stages)-1] != p.Stage {
			stages = append(stages, p.Stage)
		}
		sized = sized || (p.Bytes > 0 && p.Stage != "hardening" && p.Stage != "hashing")
	}})
	if err != nil {
		t.Fatalf("Build: %v\n%s", err, log.Bytes())
	}
	mu.Lock()
	for _, want := range []string{"fetching", "extracting", "unpacking", "configuring", "hardening", "hashing"} {
		if !slices.Contains(stages, want) {
			t.Errorf("progress stages %v lack %s", stages, want)
		}
	}
	if !sized {
		t.Errorf("no size reported while debootstrap ran")
	}
	mu.Unlock()
	t.Logf("built %s (%d bytes, %d packages) in %v", m.Digest, m.SizeBytes, len(m.Packages), time.Since(start).Round(time.Second))
	if _, ok := m.Packages["busybox"]; !ok {
		t.Errorf("busybox missing from %v", m.Packages)
	}
	img, err := s.Resolve("shell")
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if err := s.Verify(t.Context(), "shell"); err != nil {
		t.Errorf("Verify: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(img.Rootfs, "var/lib/apt/lists")); len(ents) != 0 {
		t.Errorf("apt lists not emptied: %d entries", len(ents))
	}
	if ents, _ := os.ReadDir(filepath.Join(img.Rootfs, "dev")); len(ents) != 0 {
		t.Errorf("/dev not emptied: %d entries", len(ents))
	}
	if mounts, err := mountsUnder(s.Root()); err != nil || len(mounts) != 0 {
		t.Errorf("mounts left under the store: %v, %v", mounts, err)
	}
	out, err := exec.CommandContext(t.Context(), "chroot", "--userspec=65534:65534", img.Rootfs,
		"/bin/busybox", "sh", "-c", "echo ok $(id -u)").CombinedOutput()
	if err != nil || string(out) != "ok 65534\n" {
		t.Errorf("running busybox in the image: %q, %v; want \"ok 65534\"", out, err)
	}

	calls := 0
	s.bootstrap = func(ctx context.Context, rootfs string, rt Runtime, opts BuildOptions) error {
		calls++
		return errors.New("bootstrap called")
	}
	if again, err := s.Build(t.Context(), "shell", BuildOptions{}); err != nil || again.Digest != m.Digest || calls != 0 {
		t.Errorf("second Build = %s, %v after %d bootstraps; want %s without bootstrapping", again.Digest, err, calls, m.Digest)
	}
}

// TestBuildRebuildsOutdated checks that Build without Force rebuilds an
// image built from another definition of its runtime, and only then.
func TestBuildRebuildsOutdated(t *testing.T) {
	dirOf := func(s *fakeStore, m Manifest) string { return s.imageDir(strings.TrimPrefix(m.Digest, "sha256:")) }
	tests := []struct {
		name string
		// change makes the built image outdated, or not; it returns the
		// bootstraps the next Build must run.
		change      func(t *testing.T, s *fakeStore, m Manifest) int32
		wantPackage string // a package the rebuilt manifest must list
	}{
		{"a package added to the runtime", func(t *testing.T, s *fakeStore, m Manifest) int32 {
			rt := Runtimes["python"]
			changed := rt
			changed.Packages = append(slices.Clone(rt.Packages), "python3-extra")
			Runtimes["python"] = changed
			t.Cleanup(func() { Runtimes["python"] = rt })
			return 1
		}, "python3-extra"},
		{"a strip pattern added", func(t *testing.T, s *fakeStore, m Manifest) int32 {
			rt := Runtimes["python"]
			changed := rt
			changed.Strip = append(slices.Clone(rt.Strip), "usr/bin/python3-extra-tool")
			Runtimes["python"] = changed
			t.Cleanup(func() { Runtimes["python"] = rt })
			return 1
		}, ""},
		{"a manifest of an older build without a definition, lacking a package", func(t *testing.T, s *fakeStore, m Manifest) int32 {
			editManifest(t, dirOf(s, m), func(m *Manifest) {
				m.Definition = ""
				delete(m.Packages, "python3-matplotlib")
			})
			return 1
		}, "python3-matplotlib"},
		{"a manifest of an older build without a definition, with every package", func(t *testing.T, s *fakeStore, m Manifest) int32 {
			editManifest(t, dirOf(s, m), func(m *Manifest) { m.Definition = "" })
			return 0
		}, ""},
		{"nothing changed", func(t *testing.T, s *fakeStore, m Manifest) int32 { return 0 }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFakeStore(t)
			first := s.mustBuild(t, "python", BuildOptions{})
			want := 1 + tt.change(t, s, first)
			if _, err := s.Current("python"); (want > 1) != errdefs.IsFailedPrecondition(err) {
				t.Errorf("Current = %v, want ErrFailedPrecondition: %v", err, want > 1)
			}
			m := s.mustBuild(t, "python", BuildOptions{})
			if n := s.calls.Load(); n != want {
				t.Fatalf("got %d bootstraps, want %d", n, want)
			}
			if _, ok := m.Packages[tt.wantPackage]; tt.wantPackage != "" && !ok {
				t.Errorf("rebuilt manifest has no package %s: %v", tt.wantPackage, m.Packages)
			}
			// The rebuilt image is current: the next Build does nothing,
			// also when the rebuild found the same tree already stored.
			if _, err := s.Current("python"); err != nil {
				t.Errorf("Current after the build: %v", err)
			}
			s.mustBuild(t, "python", BuildOptions{})
			if n := s.calls.Load(); n != want {
				t.Errorf("got %d bootstraps after another build, want %d", n, want)
			}
		})
	}
}

// TestManifestCopies checks that a caller changing the manifest it got
// changes nothing of what the store remembers (the store decodes a
// manifest once and hands out copies).
func TestManifestCopies(t *testing.T) {
	s := newFakeStore(t)
	s.mustBuild(t, "python", BuildOptions{})
	first, err := s.Current("python")
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Packages) == 0 || len(first.Interpreter) == 0 {
		t.Fatalf("the manifest has no packages or interpreter to change: %+v", first)
	}
	first.Packages["changed-by-a-caller"] = "1"
	first.Interpreter[0] = "/changed"
	again, err := s.Current("python")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := again.Packages["changed-by-a-caller"]; ok || again.Interpreter[0] == "/changed" {
		t.Errorf("a caller's change to its manifest reached the next caller: %+v", again)
	}
}

// TestBuildModes builds an image and finds every path of the store private
// to root but what sandboxes reach (fsmode.Exceptions): the image's tree
// and the directories on its way.
func TestBuildModes(t *testing.T) {
	f := newFakeStore(t)
	m := f.mustBuild(t, "python", BuildOptions{})
	// The store's root and cache are the data directory's, which set-up
	// makes.
	if err := os.Chmod(f.root, fsmode.Traverse); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(f.cacheDir(), fsmode.Dir); err != nil {
		t.Fatal(err)
	}
	l := fsmode.Layout{DataDir: f.root}
	if bad := fsmode.Check(l); len(bad) != 0 {
		t.Errorf("after a build: got %q, want every path as fsmode says", bad)
	}
	hex := strings.TrimPrefix(m.Digest, "sha256:")
	for _, c := range []struct {
		path string
		want fs.FileMode
	}{
		{"images", fsmode.Traverse},
		{"images/sha256/" + hex, fsmode.Traverse},
		{"images/sha256/" + hex + "/manifest.json", fsmode.File},
		{"images/refs", fsmode.Dir},
		{"images/refs/python", fsmode.File},
		{"images/tmp", fsmode.Dir},
	} {
		if fi, err := os.Stat(filepath.Join(f.root, c.path)); err != nil || fi.Mode().Perm() != c.want {
			t.Errorf("%s: got %v, %v; want mode %#o", c.path, fi.Mode(), err, c.want)
		}
	}
	// The check sees a manifest open to others.
	if err := os.Chmod(filepath.Join(f.imageDir(hex), "manifest.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if bad := fsmode.Check(l); len(bad) != 1 || !strings.Contains(bad[0], "manifest.json") {
		t.Errorf("with the manifest 0644: got %q, want it alone", bad)
	}
	if _, err := f.Resolve("python"); err != nil {
		t.Errorf("Resolve after the build: %v", err)
	}
}
