package api_test

import (
	"bytes"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/wire"
)

// nobody is the uid and gid of the sandboxes' own user, and of an
// unprivileged local user in the tests.
const nobody = 65534

// newDataDir makes a data directory as `make setup` leaves one, in a
// directory that sandboxes can pass through: the installed python and
// shell images hard-linked (their trees are not Stockade's to set, see
// fsmode.Exceptions), the rest by `stockade setup`.
func newDataDir(t *testing.T, bin string) (data, state string) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, fsmode.Traverse); err != nil {
			t.Fatal(err)
		}
	}
	data, state = filepath.Join(dir, "data"), filepath.Join(dir, "state")
	for _, name := range []string{"python", "shell"} {
		img := testenv.Image(t, name)
		imgDir := filepath.Dir(img.Rootfs)
		dst := filepath.Join(data, "images", "sha256", filepath.Base(imgDir))
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-al", img.Rootfs, dst+"/").CombinedOutput(); err != nil {
			t.Fatalf("linking image %s: %v: %s", name, err, out)
		}
		// Copied, not linked: the install's own would change mode with it.
		for _, f := range []struct{ src, dst string }{
			{filepath.Join(imgDir, "manifest.json"), filepath.Join(dst, "manifest.json")},
			{filepath.Join(testenv.DataDir(), "images", "refs", name), filepath.Join(data, "images", "refs", name)},
		} {
			b, err := os.ReadFile(f.src)
			if err == nil {
				err = os.MkdirAll(filepath.Dir(f.dst), 0o755)
			}
			if err == nil {
				err = os.WriteFile(f.dst, b, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	cli(t, bin, "setup", "--data-dir", data, "--state-dir", state, "--images", "python,shell", "-q")
	return data, state
}

// readable lists the paths below the layout's directories that a user
// other than root could read (mode&044) and that are neither an exception
// of fsmode nor below an opaque one, by lstat alone.
func readable(t *testing.T, l fsmode.Layout) []string {
	t.Helper()
	var out []string
	for _, r := range []struct {
		dir  string
		root fsmode.Root
	}{{l.DataDir, fsmode.DataDir}, {l.StateDir, fsmode.StateDir}} {
		err := filepath.WalkDir(r.dir, func(p string, d fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			fi, err := os.Lstat(p)
			if errors.Is(err, fs.ErrNotExist) || fi.Mode()&fs.ModeSymlink != 0 {
				return nil
			}
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(r.dir, p)
			want, opaque := fsmode.Want(r.root, filepath.ToSlash(rel), fi.IsDir())
			// A zero want is an exception that keeps its own mode.
			if fi.Mode().Perm()&0o044 != 0 && (want == fsmode.File || want == fsmode.Dir || want != 0 && fi.Mode().Perm()&^want != 0) {
				out = append(out, p+": "+fi.Mode().String())
			}
			if opaque && fi.IsDir() {
				return fs.SkipDir
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walking %s: %v", r.dir, err)
		}
	}
	return out
}

// TestModes sets up a data directory as `make setup` does, runs a one-shot
// on each tier from the CLI, and a daemon (under umask 077) that serves a
// one-shot, a session and its pause, and checks after each that no path of the data
// and state directories is open to other users beyond fsmode's
// exceptions; then that uid 65534 can neither open the database nor list
// keys with the CLI.
func TestModes(t *testing.T) {
	requireSandboxes(t)
	testenv.RequiresBinary(t, "runsc")
	bin := testenv.Build(t, "./cmd/stockade")
	data, state := newDataDir(t, bin)
	l := fsmode.Layout{DataDir: data, StateDir: state, DataRoot: filepath.Join(data, "data")}
	check := func(when string) {
		t.Helper()
		if bad := fsmode.Check(l); len(bad) != 0 {
			t.Errorf("%s: paths whose mode is not fsmode's: %q", when, bad)
		}
		if open := readable(t, l); len(open) != 0 {
			t.Errorf("%s: paths other users may read: %q", when, open)
		}
	}
	check("after setup")

	cli(t, bin, "workspace", "create", "modes", "--data-dir", data)
	key := strings.TrimSpace(cli(t, bin, "key", "create", "--workspace", "modes", "--role", "agent", "--data-dir", data))
	cli(t, bin, "credits", "grant", "modes", "100", "--data-dir", data)
	cli(t, bin, "policy", "set", "modes", "--approval=none", "--data-dir", data)
	check("after the admin commands")
	for _, driver := range []string{"runc", "gvisor"} {
		if out := cli(t, bin, "run", "--data-dir", data, "--state-dir", state, "--driver", driver, "--runtime", "shell", "-c", "id -u"); strings.TrimSpace(out) != "65534" {
			t.Errorf("stockade run on %s: got %q, want 65534", driver, out)
		}
	}
	check("after a one-shot on each tier")

	cfg := filepath.Join(t.TempDir(), "stockade.yaml")
	if err := os.WriteFile(cfg, []byte("driver: gvisor\npools: []\ndocker_host: unix://"+filepath.Join(filepath.Dir(cfg), "no-docker.sock")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The daemon runs under umask 077, as an operator may start it:
	// what sandboxes read it must make readable itself.
	serve := func() *daemon {
		t.Helper()
		return startProcess(t, exec.Command("/bin/sh", "-c", `umask 077 && exec "$0" serve "$@"`, bin,
			"--config", cfg, "--driver", "gvisor", "--data-dir", data, "--state-dir", state, "--listen", "127.0.0.1:0", "--egress=false"))
	}
	d := serve()
	if ex := do(t, d.url, "POST", "/v1/executions", key, capability.InvokeRequest{Runtime: "shell", Code: "echo hi"}).want(t, http.StatusOK).execution(t); string(ex.Status) != string(model.StatusSucceeded) {
		t.Errorf("a one-shot through the daemon: got %q, want succeeded", ex.Status)
	}
	var ss wire.Session
	do(t, d.url, "POST", "/v1/sessions", key, capability.CreateSessionRequest{Runtime: "python"}).want(t, http.StatusCreated).decode(t, &ss)
	var c wire.Cell
	do(t, d.url, "POST", "/v1/sessions/"+ss.ID+"/exec", key, capability.CellRequest{Code: "open('/workspace/f', 'w').write('x'); x = 41"}).want(t, http.StatusOK).decode(t, &c)
	if c.Status != "succeeded" {
		t.Errorf("a cell: got %+v, want succeeded", c)
	}
	check("with a live session")
	var paused wire.Session
	do(t, d.url, "POST", "/v1/sessions/"+ss.ID+"/pause", key, nil).want(t, http.StatusOK).decode(t, &paused)
	if paused.State != "paused" {
		t.Fatalf("pause: got %+v, want paused", paused)
	}
	if ents, err := os.ReadDir(filepath.Join(data, "checkpoints")); err != nil || len(ents) != 1 {
		t.Fatalf("checkpoints: got %v, %v; want the paused session's", ents, err)
	}
	check("with a paused session")
	// The checkpoint, made private, restores.
	do(t, d.url, "POST", "/v1/sessions/"+ss.ID+"/exec", key, capability.CellRequest{Code: "print(x + 1)"}).want(t, http.StatusOK).decode(t, &c)
	if c.Status != "succeeded" || c.Stdout != "42\n" {
		t.Errorf("a cell resuming the session: got %+v, want 42", c)
	}
	check("after the resume")

	// The checks see what they look for: a database left open by an
	// older install (the daemon's Fix makes it private again).
	db := filepath.Join(data, "stockade.db")
	if err := os.Chmod(db, 0o644); err != nil {
		t.Fatal(err)
	}
	if bad, open := fsmode.Check(l), readable(t, l); len(bad) != 1 || len(open) != 1 || !strings.HasPrefix(open[0], db+":") {
		t.Errorf("with the database 0644: got %q and %q, want it alone in each", bad, open)
	}
	d.stop()
	d = serve()
	check("after a restart over a database left 0644")
	defer d.stop()
	// The session ends before the daemon stops: a stopped daemon keeps its
	// sessions' sandboxes for a restart, which this test never makes.
	defer func() { do(t, d.url, "DELETE", "/v1/sessions/"+ss.ID, key, nil).want(t, http.StatusOK) }()

	// uid 65534 reaches the data directory (it reads the guest agent, which
	// sandboxes run) but not the database.
	guests, _ := filepath.Glob(filepath.Join(data, "bin", "stockade-guest-*"))
	for _, c := range []struct {
		name string
		argv []string
		ok   bool
	}{
		{"read the guest agent", []string{"/bin/cat", guests[0]}, true},
		{"read the database", []string{"/bin/cat", db}, false},
		{"read its write-ahead log", []string{"/bin/cat", db + "-wal"}, false},
		{"list keys with the CLI", []string{bin, "key", "list", "--workspace", "modes", "--data-dir", data}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(c.argv[0], c.argv[1:]...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = nil, &stderr
			err := cmd.Run()
			switch {
			case c.ok && err != nil:
				t.Errorf("as uid %d: got %v: %s, want success", nobody, err, stderr.String())
			case !c.ok && (err == nil || !strings.Contains(strings.ToLower(stderr.String()), "permission denied")):
				t.Errorf("as uid %d: got %v: %s, want permission denied", nobody, err, stderr.String())
			}
		})
	}
}
