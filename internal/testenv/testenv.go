// Package testenv gates tests on what the host offers and builds the test
// fixtures shared by packages (the guest agent, resolved images). A missing
// prerequisite skips the test with the reason, except in CI (CI=true), where
// it fails: CI installs everything the tests need.
package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/sandbox"
)

// InCI reports whether the tests run in CI.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing skips t with reason, or fails it in CI.
func Missing(t testing.TB, reason string) {
	t.Helper()
	if InCI() {
		t.Fatalf("prerequisite missing in CI: %s", reason)
	}
	t.Skipf("skipping: %s", reason)
}

// RequiresRoot gates t on running as root.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root")
	}
}

// RequiresBinary gates t on an executable and returns its path.
func RequiresBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, name+" not found on PATH (run `make setup`)")
	}
	return p
}

// DataDir is the data directory the tests use: STOCKADE_DATA_DIR or the
// default /var/lib/stockade, where `make setup` builds the images.
func DataDir() string {
	if d := os.Getenv("STOCKADE_DATA_DIR"); d != "" {
		return d
	}
	return "/var/lib/stockade"
}

// Image resolves a runtime image built by `make setup`.
func Image(t testing.TB, name string) sandbox.Image {
	t.Helper()
	img, err := image.Open(DataDir()).Resolve(name)
	if err != nil {
		Missing(t, "image "+name+": "+err.Error())
	}
	return img
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// Build compiles a main package of this module statically, once per test
// binary, and returns the executable's path. The executables live in one
// directory under the system's temporary directory, replaced (by rename,
// so a running copy is never disturbed) by a test binary that builds a
// different one, so test runs leave one copy of each behind, not one per
// run. The
// directory is named after the module's checkout, so that test runs of two
// checkouts (worktrees) never run each other's executables.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	sum := sha256.Sum256([]byte(ModuleRoot()))
	dir := filepath.Join(os.TempDir(), "stockade-test-bin-"+hex.EncodeToString(sum[:4]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	tmp := fmt.Sprintf("%s.%d", out, os.Getpid())
	if err := build(tmp, pkg); err != nil {
		t.Fatalf("building %s: %v", pkg, err)
	}
	if err := os.Chmod(tmp, 0o555); err != nil {
		t.Fatal(err)
	}
	// An identical executable stays: renaming over it would unlink the
	// file that another test binary's sandbox may be bind-mounting at that
	// moment (runc then fails with ENOENT).
	if same(tmp, out) {
		_ = os.Remove(tmp)
	} else if err := os.Rename(tmp, out); err != nil {
		t.Fatal(err)
	}
	built[pkg] = out
	return out
}

// same reports whether the files a and b have the same contents.
func same(a, b string) bool {
	sum := func(p string) ([32]byte, bool) {
		data, err := os.ReadFile(p)
		return sha256.Sum256(data), err == nil
	}
	x, okA := sum(a)
	y, okB := sum(b)
	return okA && okB && x == y
}

// Guest builds the guest agent and returns its path.
func Guest(t testing.TB) string { return Build(t, "./cmd/stockade-guest") }

// Shim builds the stockade binary and returns the command that runs a
// detached sandbox's supervisor (the drivers' Shim).
func Shim(t testing.TB) []string { return []string{Build(t, "./cmd/stockade"), "shim"} }

// build compiles a package of this module statically.
func build(out, pkg string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = ModuleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return &buildError{pkg: pkg, out: string(b), err: err}
	}
	return nil
}

type buildError struct {
	pkg, out string
	err      error
}

func (e *buildError) Error() string { return "go build " + e.pkg + ": " + e.err.Error() + "\n" + e.out }

// ModuleRoot is the directory of go.mod.
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// OccupyCgroup keeps the first cgroup directory among paths (a driver's
// Leftovers of a sandbox) busy with a host process, so that removing it
// fails, and returns that directory and the release, which ends the
// process (idempotent; also registered as t's cleanup).
func OccupyCgroup(t testing.TB, paths []string) (dir string, release func()) {
	t.Helper()
	for _, p := range paths {
		if strings.HasPrefix(p, "/sys/fs/cgroup/") {
			dir = p
			break
		}
	}
	if dir == "" {
		t.Fatalf("no cgroup among %v", paths)
	}
	squatter := exec.Command("sleep", "120")
	if err := squatter.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = squatter.Process.Kill()
			_ = squatter.Wait()
		})
	}
	t.Cleanup(release)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(squatter.Process.Pid)), 0); err != nil {
		release()
		t.Fatal(err)
	}
	return dir, release
}
