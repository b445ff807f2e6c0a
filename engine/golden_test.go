package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// goldenStart imports pandas and sympy, seeds nothing itself, and keeps
// BOOT, random bytes drawn once: every session restored from one
// checkpoint has the same BOOT, and a session started cold another.
const goldenStart = `import os, random, uuid, json
import numpy, pandas, sympy
BOOT = os.urandom(8).hex()
open("/tmp/from-start", "w").write("start")
print("started, which no caller sees")`

// goldenEngine is an engine over gVisor whose tool gold runs template
// gold (golden: true, goldenStart), keeping golden checkpoints in dir.
func goldenEngine(t *testing.T, dir string, tm image.TemplateManifest) *Engine {
	t.Helper()
	return goldenEngineOf(t, dir, tm, "")
}

// goldenEngineOf is goldenEngine whose driver runs runsc as binary
// (empty: the one on PATH).
func goldenEngineOf(t *testing.T, dir string, tm image.TemplateManifest, binary string) *Engine {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	d, err := gvisor.New(gvisor.Config{Binary: binary, StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	imgs := templateImages{Store: image.Open(testenv.DataDir()), templates: map[string]image.TemplateManifest{tm.Name: tm}}
	e, err := New(map[string]sandbox.Driver{"gvisor": d}, "gvisor", imgs, sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		boundTools(t, "gvisor", map[string]image.TemplateManifest{"gold": tm}),
		WithGolden(GoldenOptions{Dir: dir, Workspace: poolWorkspace, Labels: map[string]string{LabelOwner: poolOwner}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = e.Wait(ctx)
		if err := e.DropReadySlots(ctx); err != nil {
			t.Errorf("dropping the sandboxes created ahead: %v", err)
		}
	})
	return e
}

// preparedOf is the driver's count of its sandboxes created ahead
// (ocidriver.Snapshotting.Prepared): ready, taken by a restore, failed.
func preparedOf(t *testing.T, e *Engine) (ready, claimed, failed int) {
	t.Helper()
	p, ok := e.drivers["gvisor"].(interface{ Prepared() (int, int, int) })
	if !ok {
		t.Fatal("the gvisor driver does not count its sandboxes created ahead")
	}
	return p.Prepared()
}

func goldTemplate() image.TemplateManifest {
	return image.TemplateManifest{Name: "gold", Base: "python", Golden: true, Env: map[string]string{"TPL_GREETING": "hello"},
		Start: goldenStart, Ready: "assert sympy.sqrt(4) == 2"}
}

// TestGoldenSessions makes a golden checkpoint of a python template on
// gVisor and restores it three times as three sessions: each answers a
// cell with pandas and sympy that Start imported, without the output of
// Start; each came from the checkpoint (the BOOT Start drew is the
// checkpoint's in all three, where a cold session draws another); they
// share nothing (a file in /workspace and /tmp, a variable), their
// /workspace starts empty, and their random numbers (random, numpy,
// os.urandom, uuid4) differ.
func TestGoldenSessions(t *testing.T) {
	dir := t.TempDir()
	e := goldenEngine(t, dir, goldTemplate())
	ctx := t.Context()
	cold, err := openTemplate(t, e, "gold", "")
	if err != nil {
		t.Fatal(err)
	}
	coldBoot := pyCell(t, cold, "print(BOOT)").Stdout
	_ = cold.Close(ctx)

	if err := e.MakeGolden(ctx, "gold"); err != nil {
		t.Fatalf("MakeGolden: %v", err)
	}
	n, err := e.GoldenBytes("gold")
	if err != nil || n <= 0 {
		t.Fatalf("GoldenBytes: %d, %v; want a size", n, err)
	}
	t.Logf("golden checkpoint: %d bytes", n)
	if fi, err := os.Stat(filepath.Join(dir, "gold")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the template's checkpoint directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
	// Made once: a second call finds it.
	if err := e.MakeGolden(ctx, "gold"); err != nil {
		t.Fatalf("MakeGolden again: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "gold"))
	if len(entries) != 1 {
		t.Errorf("got %d entries in the template's directory, want 1 checkpoint", len(entries))
	}

	// MakeGolden created a sandbox ahead for the first session.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if ready, _, _ := preparedOf(t, e); ready == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no sandbox was created ahead for the golden checkpoint within a minute")
		}
	}

	var sessions []*Session
	ids := map[string]bool{}
	for i := range 3 {
		s, err := e.OpenSession(ctx, SessionSpec{Tool: "gold", Workspace: poolWorkspace,
			Labels: map[string]string{LabelOwner: poolOwner, LabelSession: "ses_gold" + string(rune('a'+i))}})
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		sessions = append(sessions, s)
		ids[s.SandboxID()] = true
	}
	if len(ids) != 3 {
		t.Errorf("got sandbox IDs %v, want 3 of their own", ids)
	}
	// The first session at least restored into the slot, which the
	// checks below see restored as the others.
	if _, claimed, failed := preparedOf(t, e); claimed < 1 || failed != 0 {
		t.Errorf("sandboxes created ahead: %d taken, %d failed; want at least 1 taken, none failed", claimed, failed)
	}
	randoms := map[string]string{}
	for i, s := range sessions {
		r := pyCell(t, s, `print(pandas.DataFrame({"a": [1, 2]}).a.sum(), sympy.sqrt(8), os.environ["TPL_GREETING"])`)
		if r.Stdout != "3 2*sqrt(2) hello\n" || r.Stderr != "" {
			t.Fatalf("session %d: got stdout %q, stderr %q, error %+v; want %q", i, r.Stdout, r.Stderr, r.Error, "3 2*sqrt(2) hello\n")
		}
		if r := pyCell(t, s, "print(BOOT)"); r.Stdout == coldBoot || (i > 0 && r.Stdout != pyCell(t, sessions[0], "print(BOOT)").Stdout) {
			t.Errorf("session %d: BOOT %q (cold %q): not restored from the one checkpoint", i, r.Stdout, coldBoot)
		}
		if r := pyCell(t, s, `print(os.listdir("/workspace"), open("/tmp/from-start").read(), sorted(k for k in globals() if not k.startswith("_")))`); r.Stdout !=
			"[] start ['BOOT', 'json', 'numpy', 'os', 'pandas', 'random', 'sympy', 'uuid']\n" {
			t.Errorf("session %d: got %q, want an empty /workspace, Start's /tmp file and Start's names only", i, r.Stdout)
		}
		r = pyCell(t, s, `print(random.random(), numpy.random.rand(), os.urandom(8).hex(), uuid.uuid4())`)
		for j, v := range strings.Fields(r.Stdout) {
			if other, ok := randoms[v]; ok {
				t.Errorf("session %d's random value %d, %s, is %s's too", i, j, v, other)
			}
			randoms[v] = "session " + string(rune('0'+i))
		}
		if len(strings.Fields(r.Stdout)) != 4 {
			t.Fatalf("session %d: got %q, want four random values", i, r.Stdout)
		}
	}
	// What cannot change: the str hash seed, fixed at the interpreter's
	// start, is the checkpoint's in every session.
	if h0, h1 := pyCell(t, sessions[0], `print(hash("stockade"))`).Stdout, pyCell(t, sessions[1], `print(hash("stockade"))`).Stdout; h0 != h1 {
		t.Errorf("hash of a str: %q and %q; golden.go says every restore shares the seed", h0, h1)
	}
	// What one session does, another does not see.
	a, b := sessions[0], sessions[1]
	pyCell(t, a, `MINE = 1; open("/workspace/a.txt", "w").write("a"); open("/tmp/a.txt", "w").write("a")`)
	if r := pyCell(t, a, `print(os.path.exists("/workspace/a.txt"), os.path.exists("/tmp/a.txt"), "MINE" in globals())`); r.Stdout != "True True True\n" {
		t.Fatalf("the writing session: got %q, want its own file and variable", r.Stdout)
	}
	if r := pyCell(t, b, `print(os.path.exists("/workspace/a.txt"), os.path.exists("/tmp/a.txt"), "MINE" in globals())`); r.Stdout != "False False False\n" {
		t.Errorf("another session of the same checkpoint: got %q, want none of the first's file and variable", r.Stdout)
	}
	// A session of tighter limits is restored too, and bound to them
	// (the restore keeps the checkpoint's; Bind tightens them).
	small, err := e.OpenSession(ctx, SessionSpec{Tool: "gold", Workspace: poolWorkspace, Limits: sandbox.Limits{Memory: 256 << 20},
		Labels: map[string]string{LabelOwner: poolOwner, LabelSession: "ses_goldsmall"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = small.Close(context.Background()) })
	if r := pyCell(t, small, "print(BOOT)"); r.Stdout != pyCell(t, a, "print(BOOT)").Stdout {
		t.Fatalf("a session of 256 MiB: BOOT %q, not the checkpoint's: it started cold", r.Stdout)
	}
	const hog = `x = b"x" * (250 << 20); del x`
	if r := pyCell(t, sessions[2], hog); r.Status != sandbox.StatusSucceeded {
		t.Fatalf("250 MiB in a session of the tool's 512 MiB: got %+v, want it to succeed", r)
	}
	r, err := small.Cell(ctx, CellRequest{Code: hog, Timeout: time.Minute})
	var lost *SandboxLostError
	if errors.As(err, &lost) {
		r, err = lost.Result, nil
	}
	if err != nil || r.Status != sandbox.StatusOOMKilled {
		t.Errorf("250 MiB in a session of 256 MiB: got %+v, %v; want oom_killed", r, err)
	}
	// A restored session pauses and resumes as any other.
	cp := filepath.Join(t.TempDir(), "paused")
	if _, err := e.PauseSession(ctx, a, cp); err != nil {
		t.Fatalf("pausing a restored session: %v", err)
	}
	resumed, err := e.ResumeSession(ctx, SessionSpec{Driver: "gvisor", Tool: "gold", Runtime: "python",
		Labels: map[string]string{LabelOwner: poolOwner, LabelSession: "ses_golda"}}, cp)
	if err != nil {
		t.Fatalf("resuming a restored session: %v", err)
	}
	t.Cleanup(func() { _ = resumed.Close(context.Background()) })
	if r := pyCell(t, resumed, `print("MINE" in globals(), open("/workspace/a.txt").read(), sympy.sqrt(4))`); r.Stdout != "True a 2\n" {
		t.Errorf("the resumed session: got %q, stderr %q; want its variable, its file and Start's imports", r.Stdout, r.Stderr)
	}
	// A kernel restarted in a restored session runs Start again.
	if r := pyCell(t, b, "os._exit(1)"); !r.KernelRestarted {
		t.Fatalf("got %+v, want the kernel restarted", r)
	}
	if r := pyCell(t, b, "print(sympy.sqrt(9))"); r.Stdout != "3\n" {
		t.Errorf("after a restart: got %q, stderr %q; want 3", r.Stdout, r.Stderr)
	}
}

// TestGoldenRefused checks the templates MakeGolden refuses: one whose
// Start leaves files in /workspace (every restore would share them), one
// that does not ask for a checkpoint; and that their sessions start cold.
func TestGoldenRefused(t *testing.T) {
	tm := goldTemplate()
	tm.Start = `open("/workspace/model.bin", "w").write("m")`
	tm.Ready = ""
	e := goldenEngine(t, t.TempDir(), tm)
	err := e.MakeGolden(t.Context(), "gold")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "model.bin") {
		t.Errorf("a start that writes to /workspace: got %v, want ErrFailedPrecondition naming model.bin", err)
	}
	if _, err := e.GoldenBytes("gold"); !errdefs.IsNotFound(err) {
		t.Errorf("GoldenBytes after the refusal: got %v, want ErrNotFound", err)
	}
	tm = goldTemplate()
	tm.Golden = false
	e = goldenEngine(t, t.TempDir(), tm)
	if err := e.MakeGolden(t.Context(), "gold"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "golden: true") {
		t.Errorf("a template without golden: got %v, want ErrFailedPrecondition", err)
	}
}

// TestGoldenContainerTier checks that on runc MakeGolden says the
// template starts cold, and its sessions do.
func TestGoldenContainerTier(t *testing.T) {
	e := runcTemplateEngine(t, WithGolden(GoldenOptions{Dir: t.TempDir(), Workspace: poolWorkspace}))
	err := e.MakeGolden(t.Context(), "analytics")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "the container tier cannot restore a checkpoint: template analytics starts cold") {
		t.Errorf("MakeGolden on runc: got %v, want ErrFailedPrecondition saying the template starts cold", err)
	}
	s, err := openTemplate(t, e, "analytics", "")
	if err != nil {
		t.Fatal(err)
	}
	if r := pyCell(t, s, seesTemplate); r.Stdout != wantTemplate {
		t.Errorf("a cold session: got %q, want %q", r.Stdout, wantTemplate)
	}
}

// TestGoldenShell restores a shell template's golden checkpoint twice: both
// sessions have what Start set (the same BOOT, drawn once), and $RANDOM,
// which Start used (busybox seeds it at its first use) and the restore
// reseeds, differs between them.
func TestGoldenShell(t *testing.T) {
	e := goldenEngine(t, t.TempDir(), image.TemplateManifest{Name: "gold", Base: "shell", Golden: true,
		Start: "BOOT=$(od -An -N4 -tu4 /dev/urandom); X=41; R0=$RANDOM; echo started", Ready: "[ \"$X\" = 41 ]"})
	if err := e.MakeGolden(t.Context(), "gold"); err != nil {
		t.Fatal(err)
	}
	var boots, randoms []string
	for i := range 2 {
		s, err := e.OpenSession(t.Context(), SessionSpec{Tool: "gold", Workspace: poolWorkspace,
			Labels: map[string]string{LabelOwner: poolOwner, LabelSession: "ses_shell" + string(rune('a'+i))}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		if r := pyCell(t, s, `echo $((X + 1))`); r.Stdout != "42\n" {
			t.Fatalf("session %d: got %q, stderr %q; want 42", i, r.Stdout, r.Stderr)
		}
		boots = append(boots, pyCell(t, s, `echo $BOOT`).Stdout)
		randoms = append(randoms, pyCell(t, s, `echo $RANDOM $RANDOM $RANDOM`).Stdout)
	}
	if boots[0] != boots[1] || strings.TrimSpace(boots[0]) == "" {
		t.Errorf("BOOT %q and %q: the sessions were not both restored from the checkpoint", boots[0], boots[1])
	}
	if randoms[0] == randoms[1] {
		t.Errorf("$RANDOM gave %q in both sessions; want it reseeded", randoms[0])
	}
}

// TestGoldenRefusesDataTools checks that a tool that mounts data or
// reaches the broker has no golden checkpoint (its sessions start cold,
// with their mounts), as it has no pool: the golden sandbox holds
// neither.
func TestGoldenRefusesDataTools(t *testing.T) {
	e := goldenEngine(t, t.TempDir(), goldTemplate())
	plain, err := e.tools.Get("gold")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.goldenFor(plain); err != nil {
		t.Fatalf("the plain tool: %v, want a golden checkpoint", err)
	}
	mounts, creds := plain, plain
	mounts.Filesystem.Mounts = []sandbox.Mount{{Source: t.TempDir(), Target: "/data"}}
	creds.Credentials = []string{"github.read"}
	for name, tool := range map[string]tools.Tool{"mounts": mounts, "credentials": creds} {
		if _, err := e.goldenFor(tool); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "starts cold") {
			t.Errorf("a tool with %s: got %v, want ErrFailedPrecondition saying the template starts cold", name, err)
		}
	}
}

// TestGoldenRemadeForAnotherBuild makes a shell template's golden
// checkpoint with runsc behind a wrapper script, then changes the script
// (another runtime build, which cannot restore the checkpoint): the next
// session starts cold and has the checkpoint remade for the new build in
// the background, in place of the old one; the sessions after are
// restored from it.
func TestGoldenRemadeForAnotherBuild(t *testing.T) {
	testenv.RequiresBinary(t, "runsc")
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nexec " + runsc + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e := goldenEngineOf(t, dir, image.TemplateManifest{Name: "gold", Base: "shell", Golden: true,
		Start: "BOOT=$(od -An -N4 -tu4 /dev/urandom); echo started"}, wrapper)
	ctx := t.Context()
	if err := e.MakeGolden(ctx, "gold"); err != nil {
		t.Fatal(err)
	}
	checkpoints := func() []string {
		entries, err := os.ReadDir(filepath.Join(dir, "gold"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, d := range entries {
			names = append(names, d.Name())
		}
		return names
	}
	first := checkpoints()
	if len(first) != 1 {
		t.Fatalf("the template's checkpoints: got %v, want one", first)
	}
	n := 0
	boot := func() string {
		t.Helper()
		n++
		s, err := e.OpenSession(ctx, SessionSpec{Tool: "gold", Workspace: poolWorkspace,
			Labels: map[string]string{LabelOwner: poolOwner, LabelSession: fmt.Sprintf("ses_build%d", n)}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.WithoutCancel(ctx))
		b := strings.TrimSpace(pyCell(t, s, `echo $BOOT`).Stdout)
		if b == "" {
			t.Fatal("the session has no BOOT")
		}
		return b
	}
	old := boot()
	if again := boot(); again != old {
		t.Fatalf("BOOT %q, then %q: the sessions were not restored from the checkpoint", old, again)
	}

	if err := os.WriteFile(wrapper, []byte(script+"# another build\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if cold := boot(); cold == old {
		t.Fatalf("with another build: BOOT %q, the old checkpoint's: restored by another build", cold)
	}
	if err := e.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if now := checkpoints(); len(now) != 1 || now[0] == first[0] {
		t.Fatalf("after the new build's first session: checkpoints %v, want one other than %v", now, first)
	}
	a, b := boot(), boot()
	if a != b || a == old {
		t.Errorf("sessions after the remake: BOOT %q and %q (old checkpoint's %q), want both the new checkpoint's", a, b, old)
	}
}
