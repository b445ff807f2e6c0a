package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// TestSessionMemoryBudget checks that sessions count in the memory
// budget from their opening to their end or pause, on gVisor (which can
// pause): with room for one session's sandbox, a second session, a
// one-shot run and the resume of a paused session are refused while one
// lives, and served once it is paused or closed.
func TestSessionMemoryBudget(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	d, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	mem := sandbox.DefaultLimits().Memory
	e, err := New(map[string]sandbox.Driver{"gvisor": d}, "gvisor", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		WithTestKernel(), WithMemoryBudget(mem+mem/2))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	open := func() (*Session, error) {
		return e.OpenSession(ctx, SessionSpec{Runtime: "shell", Workspace: 8 << 20, Labels: map[string]string{LabelOwner: "engine-test"}})
	}
	full := func(what string, err error) {
		t.Helper()
		if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "memory_budget") {
			t.Errorf("%s with the budget taken: got %v, want ErrResourceExhausted naming memory_budget", what, err)
		}
	}
	first, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close(context.Background())
	if s, err := open(); err == nil {
		s.Close(context.Background())
		t.Fatal("a second session with room for one: opened")
	} else {
		full("a second session", err)
	}
	full("Room for a one-shot run", e.Room(Request{Runtime: "shell", Code: []byte("true")}))

	// Paused, the first holds no memory: a second opens, and the first's
	// resume waits for room.
	dir := filepath.Join(t.TempDir(), "checkpoint")
	if _, err := e.PauseSession(ctx, first, dir); err != nil {
		t.Fatal(err)
	}
	second, err := open()
	if err != nil {
		t.Fatalf("a session once the other is paused: %v", err)
	}
	_, err = e.ResumeSession(ctx, SessionSpec{Driver: "gvisor", Runtime: "shell"}, dir)
	full("a resume", err)
	if err := second.Close(ctx); err != nil {
		t.Fatal(err)
	}
	resumed, err := e.ResumeSession(ctx, SessionSpec{Driver: "gvisor", Runtime: "shell"}, dir)
	if err != nil {
		t.Fatalf("a resume once the other session is closed: %v", err)
	}
	defer resumed.Close(context.Background())
	if err := e.Room(Request{Runtime: "shell", Code: []byte("true")}); err == nil {
		t.Error("Room with the resumed session live: got room, want none")
	}
}

// TestResumedSessionCountsItsTool checks that a resumed session counts in
// the memory budget at its own tool's memory limit, as its opening did,
// not at the default tool's: with a budget of 1.25 GiB, a session of a
// 1 GiB tool leaves no room for a 512 MiB one-shot, before its pause and
// after its resume.
func TestResumedSessionCountsItsTool(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	d, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	const big = 1 << 30
	e, err := New(map[string]sandbox.Driver{"gvisor": d}, "gvisor", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		WithTestKernel(), WithMemoryBudget(big+big/4), withToolsFile(t, `
tools:
  - name: big
    input_trust: trusted
    tier: gvisor
    limits: {memory: 1GiB}
`, tools.Options{Drivers: DriverCapabilities()}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	oneShot := Request{Runtime: "shell", Code: []byte("true")}
	s, err := e.OpenSession(ctx, SessionSpec{Runtime: "shell", Tool: "big", Workspace: 8 << 20, Labels: map[string]string{LabelOwner: "engine-test"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Room(oneShot); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("Room beside the open session: got %v, want ErrResourceExhausted", err)
	}
	dir := filepath.Join(t.TempDir(), "checkpoint")
	if _, err := e.PauseSession(ctx, s, dir); err != nil {
		t.Fatal(err)
	}
	if err := e.Room(oneShot); err != nil {
		t.Fatalf("Room with the session paused: %v", err)
	}
	resumed, err := e.ResumeSession(ctx, SessionSpec{Driver: "gvisor", Runtime: "shell", Tool: "big"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close(context.Background())
	if err := e.Room(oneShot); !errdefs.IsResourceExhausted(err) {
		t.Errorf("Room beside the resumed session: got %v, want ErrResourceExhausted (it counts its tool's 1 GiB)", err)
	}
}

// TestReserve checks that a reservation holds its memory from Reserve to
// the end of the Run it is given, and is that run's memory: with room for
// one sandbox, a second Reserve is refused while one is held, a Run given
// the reservation runs (it does not take the budget twice), and every
// path gives the memory back: the run's end, a Release without a run, a
// Run of a request that does not validate.
func TestReserve(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	mem := sandbox.DefaultLimits().Memory
	e, err := New(map[string]sandbox.Driver{"runc": d}, "runc", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		WithMemoryBudget(mem+mem/2))
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Runtime: "shell", Code: []byte("echo ran")}
	held := func(t *testing.T) {
		t.Helper()
		if r, err := e.Reserve(req); !errdefs.IsResourceExhausted(err) {
			r.Release()
			t.Fatalf("a second Reserve with room for one: got %v, want ErrResourceExhausted", err)
		}
	}
	free := func(t *testing.T) {
		t.Helper()
		if err := e.Room(req); err != nil {
			t.Fatalf("after the reservation's end: %v, want the budget free", err)
		}
	}
	for _, tc := range []struct {
		name string
		use  func(t *testing.T, r *Reservation)
	}{
		{"run", func(t *testing.T, r *Reservation) {
			run := req
			run.Reservation = r
			res, err := e.Run(t.Context(), run)
			if err != nil || res.Stdout != "ran\n" {
				t.Fatalf("Run with the reservation: got %+v, %v; want it to run", res, err)
			}
		}},
		{"released", func(t *testing.T, r *Reservation) { r.Release(); r.Release() }},
		{"a run that does not validate", func(t *testing.T, r *Reservation) {
			bad := Request{Runtime: "cobol", Code: []byte("x"), Reservation: r}
			if _, err := e.Run(t.Context(), bad); err == nil {
				t.Fatal("Run of an unknown runtime: no error")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := e.Reserve(req)
			if err != nil || r == nil {
				t.Fatalf("Reserve: got %v, %v; want memory held", r, err)
			}
			held(t)
			tc.use(t, r)
			free(t)
		})
	}
}

// TestRemoteDriverOutsideBudget checks that a remote driver's sandboxes
// do not count in the host's memory budget: with a budget smaller than
// any sandbox, a local driver's run and session are refused (the
// control: the budget is seen), a remote driver's are served.
func TestRemoteDriverOutsideBudget(t *testing.T) {
	for _, remote := range []bool{false, true} {
		drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Sessions: true, Remote: remote}
		e, err := New(map[string]sandbox.Driver{drv.ID: drv}, drv.ID, sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
			WithMemoryBudget(1<<20))
		if err != nil {
			t.Fatal(err)
		}
		req := Request{Runtime: "python", Code: []byte("1")}
		_, runErr := e.Run(t.Context(), req)
		s, openErr := e.OpenSession(t.Context(), SessionSpec{Runtime: "python", Workspace: 1 << 20})
		if s != nil {
			_ = s.Close(context.Background())
		}
		for what, err := range map[string]error{"Room": e.Room(req), "Run": runErr, "OpenSession": openErr} {
			if remote && err != nil {
				t.Errorf("remote driver, %s with a 1 MiB budget: %v, want it served", what, err)
			}
			if !remote && !errdefs.IsResourceExhausted(err) {
				t.Errorf("local driver, %s with a 1 MiB budget: %v, want ErrResourceExhausted", what, err)
			}
		}
	}
}
