package capability

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
)

// testClock is a clock a test sets (ServiceOptions.Now).
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// stalledSweep is a store whose ListActiveSessions, once stall is
// called, waits until the test ends: a sweep that does not come, as in a
// store outage or behind a long idle pause.
type stalledSweep struct {
	testStore
	mu      sync.Mutex
	stalled chan struct{}
}

func (s *stalledSweep) stall(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled = make(chan struct{})
	t.Cleanup(func() { close(s.stalled) })
}

func (s *stalledSweep) ListActiveSessions(ctx context.Context) ([]model.Session, error) {
	s.mu.Lock()
	stalled := s.stalled
	s.mu.Unlock()
	if stalled != nil {
		<-stalled
	}
	return s.testStore.ListActiveSessions(ctx)
}

// waitStatus waits, at most 10 s, until execution id is in status.
func (e *serviceEnv) waitStatus(t *testing.T, id string, status model.ExecutionStatus) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ex, err := e.st.GetExecution(t.Context(), e.ws.ID, id)
		if err != nil {
			t.Fatal(err)
		}
		if ex.Status == status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s: got %s, want %s", id, ex.Status, status)
		}
	}
}

// TestSandboxEndsItselfAtTTL runs a cell in a session whose sandbox ends
// itself at its deadline (its TTL and SandboxGrace) before the daemon's
// sweep has ended the session: the cell ends as the sweep would have
// ended it (killed, ended_by session_ended, charged, its output kept),
// and the session ends ttl, not launch_failed and failed.
func TestSandboxEndsItselfAtTTL(t *testing.T) {
	ctx := t.Context()
	clock := &testClock{now: time.Now()}
	st := &stalledSweep{testStore: openSQLite(t)}
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Sessions: true, Echo: true,
		Hold: make(chan struct{}), Lose: make(chan struct{})}
	env := newServiceEnv(t, st, drv, noApprovalPolicy(), ServiceOptions{Now: clock.Now})
	created, err := env.svc.CreateSession(ctx, env.agent, CreateSessionRequest{Runtime: "python"}, CreateSessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ss := created.Session
	inv, err := env.svc.ExecCell(ctx, env.agent, ss.ID, CellRequest{Code: "print('started')"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := inv.Execution.ID
	env.waitStatus(t, id, model.StatusRunning)
	st.stall(t)
	clock.set(ss.ExpiresAt.Add(SandboxGrace))
	close(drv.Lose)

	got, err := env.svc.Wait(ctx, env.agent, id, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != model.StatusKilled {
		t.Fatalf("the cell: got %s, want killed (result %s)", got.Status, got.Result)
	}
	var res CellResultDoc
	if err := json.Unmarshal(got.Result, &res); err != nil {
		t.Fatalf("the result %s: %v", got.Result, err)
	}
	if res.EndedBy != engine.EndedBySessionEnd {
		t.Errorf("the cell's ended_by: got %q, want %q", res.EndedBy, engine.EndedBySessionEnd)
	}
	if !strings.Contains(res.Stdout, "started") {
		t.Errorf("the cell's stdout: got %q, want its output so far", res.Stdout)
	}
	tc, err := env.st.GetToolCall(ctx, env.ws.ID, id)
	if err != nil {
		t.Fatal(err)
	}
	if tc.CreditsCharged != env.svc.price || env.svc.price == 0 {
		t.Errorf("the cell's charge: got %d, want %d (a launched cell's)", tc.CreditsCharged, env.svc.price)
	}
	after, err := env.st.GetSession(ctx, env.ws.ID, ss.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.State != model.SessionEnded || after.EndReason != model.EndTTL {
		t.Errorf("the session: got %s (%s), want ended ttl", after.State, after.EndReason)
	}
	if n := len(env.events(t, "execution.cancelled")); n != 0 {
		t.Errorf("execution.cancelled events: got %d, want none", n)
	}
}

// TestAdoptEndsLostSessions starts a daemon on sessions a previous one
// kept, whose sandboxes are gone (the fake driver re-attaches none): a
// session past its TTL ends ttl (its sandbox ended itself there), one
// before it interrupted.
func TestAdoptEndsLostSessions(t *testing.T) {
	ctx := t.Context()
	t0 := time.Now()
	clock := &testClock{now: t0}
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Sessions: true}
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{Now: clock.Now})
	tests := []struct {
		name string
		ttl  time.Duration
		want model.SessionEndReason
	}{
		{"past its TTL", time.Minute, model.EndTTL},
		{"before its TTL", 2 * time.Hour, model.EndInterrupted},
	}
	ids := make([]string, len(tests))
	for i, tt := range tests {
		created, err := env.svc.CreateSession(ctx, env.agent, CreateSessionRequest{Runtime: "python", TTLMS: tt.ttl.Milliseconds()}, CreateSessionOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = created.Session.ID
	}
	env.svc.Close(t.Context()) // keeps its sessions, as a daemon's stop does by default

	clock.set(t0.Add(time.Hour))
	eng, err := engine.New(map[string]sandbox.Driver{drv.ID: drv}, drv.ID, sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(eng, env.st, ServiceOptions{Now: clock.Now})
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(context.Background()) })
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := env.st.GetSession(ctx, env.ws.ID, ids[i])
			if err != nil {
				t.Fatal(err)
			}
			if got.State != model.SessionEnded || got.EndReason != tt.want {
				t.Errorf("the session: got %s (%s), want ended %s", got.State, got.EndReason, tt.want)
			}
		})
	}
}

// heldPause is a session driver whose sandboxes pause (Snapshots), each
// Checkpoint waiting until release is closed and then failing; started
// is closed when the first Checkpoint starts.
type heldPause struct {
	*sandboxfake.Driver
	once             sync.Once
	started, release chan struct{}
}

func (d *heldPause) Capabilities() sandbox.Capabilities {
	c := d.Driver.Capabilities()
	c.Snapshots = true
	return c
}

func (d *heldPause) Checkpoint(context.Context, sandbox.Sandbox, string) error {
	d.once.Do(func() { close(d.started) })
	<-d.release
	return errors.New("the held checkpoint was released")
}

func (d *heldPause) Restore(context.Context, string, map[string]string) (sandbox.Sandbox, error) {
	return nil, errdefs.ErrFailedPrecondition
}

// TestSweepEndsTTLBeforePausing sweeps an idle session that pauses
// (pause_after_idle), whose pause takes long, listed before a session
// past its TTL: the TTL's end does not wait for the pause, since a
// session's sandbox ends itself SandboxGrace after its TTL.
func TestSweepEndsTTLBeforePausing(t *testing.T) {
	ctx := t.Context()
	t0 := time.Now()
	clock := &testClock{now: t0}
	drv := &heldPause{Driver: &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Sessions: true},
		started: make(chan struct{}), release: make(chan struct{})}
	env := newServiceEnv(t, nil, drv.Driver, noApprovalPolicy(), ServiceOptions{Now: clock.Now})
	env.svc.Close(t.Context()) // the same store, served by a daemon whose driver pauses

	eng, err := engine.New(map[string]sandbox.Driver{drv.ID: drv}, drv.ID, sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(eng, env.st, ServiceOptions{Now: clock.Now,
		Sessions: SessionOptions{PauseAfterIdle: time.Minute, CheckpointDir: t.TempDir()}})
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(context.Background()) })
	t.Cleanup(func() { close(drv.release) }) // before Close, which waits for the sweep
	idle, err := svc.CreateSession(ctx, env.agent, CreateSessionRequest{Runtime: "python"}, CreateSessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clock.set(t0.Add(time.Second)) // listed after the idle one
	expiring, err := svc.CreateSession(ctx, env.agent, CreateSessionRequest{Runtime: "python", TTLMS: time.Minute.Milliseconds()}, CreateSessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clock.set(t0.Add(5 * time.Minute))
	select {
	case <-drv.started:
	case <-time.After(10 * time.Second):
		t.Fatal("no sweep paused the idle session within 10 s")
	}
	for _, tc := range []struct {
		name  string
		id    string
		state model.SessionState
	}{
		{"the session past its TTL", expiring.Session.ID, model.SessionEnded},
		{"the session pausing", idle.Session.ID, model.SessionActive},
	} {
		got, err := env.st.GetSession(ctx, env.ws.ID, tc.id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != tc.state {
			t.Errorf("%s, while the pause runs: got %s (%s), want %s", tc.name, got.State, got.EndReason, tc.state)
		}
	}
}

// TestUntrackKeepsTheNextCell: the goroutine of a cell whose end is
// recorded may let go of its session after the next cell was admitted and
// tracked; that cell stays tracked (the idle sweep must see it).
func TestUntrackKeepsTheNextCell(t *testing.T) {
	ls := &liveSession{}
	ls.track("ex_a")
	ls.track("ex_b") // admitted once ex_a's end was recorded
	ls.untrack("ex_a")
	if got := ls.runningCell(); got != "ex_b" {
		t.Fatalf("after the first cell let go: got %q tracked, want ex_b", got)
	}
	ls.untrack("ex_b")
	if ls.running() {
		t.Fatalf("after the last cell let go: got %q tracked, want none", ls.runningCell())
	}
}

// noReattachWhy is the sandboxfake driver's Lacks["Reattach"].
const noReattachWhy = "the fake driver keeps no sandbox beyond its creator"

// TestSessionWithoutReattachEndsAtStop stops a daemon that keeps its
// sessions (sessions.on_shutdown: keep, the default) while it serves a
// session on a driver that cannot re-attach a sandbox (the docker and
// kubernetes drivers), whose cell runs: Close ends it interrupted, with a
// detail a user reads (on its record and in its session.ended event),
// destroys its sandbox, and its cell ends killed by the shutdown. A
// session on a driver that re-attaches stays active, its sandbox kept.
func TestSessionWithoutReattachEndsAtStop(t *testing.T) {
	for _, tt := range []struct {
		name       string
		noReattach bool
	}{
		{"without Reattach", true},
		{"with Reattach", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			hold := make(chan struct{})
			defer close(hold)
			drv := &sandboxfake.Driver{ID: "kubernetes", Tier: sandbox.TierGVisor, Sessions: true, NoReattach: tt.noReattach, Echo: true, Hold: hold}
			env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{})
			created, err := env.svc.CreateSession(ctx, env.agent, CreateSessionRequest{Runtime: "python"}, CreateSessionOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ss := created.Session
			inv, err := env.svc.ExecCell(ctx, env.agent, ss.ID, CellRequest{Code: "x = 1"}, InvokeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			env.waitStatus(t, inv.Execution.ID, model.StatusRunning)
			if n := drv.Destroyed(); n != 0 {
				t.Fatalf("before Close: %d sandboxes destroyed, want none", n)
			}
			env.svc.Close(t.Context()) // keeps its sessions, as a daemon's stop does by default

			got, err := env.st.GetSession(ctx, env.ws.ID, ss.ID)
			if err != nil {
				t.Fatal(err)
			}
			ex, err := env.st.GetExecution(ctx, env.ws.ID, inv.Execution.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.noReattach {
				if got.State != model.SessionActive || drv.Destroyed() != 0 {
					t.Errorf("the session: got %s (%s), %d sandboxes destroyed; want it active, its sandbox kept", got.State, got.EndReason, drv.Destroyed())
				}
				return
			}
			const want = "the daemon stopped and driver kubernetes cannot re-attach a sandbox: " + noReattachWhy
			if got.State != model.SessionEnded || got.EndReason != model.EndInterrupted || got.EndDetail != want {
				t.Errorf("the session: got %s (%s: %q), want ended interrupted: %q", got.State, got.EndReason, got.EndDetail, want)
			}
			if n := drv.Destroyed(); n != 1 {
				t.Errorf("after Close: %d sandboxes destroyed, want the session's", n)
			}
			var res CellResultDoc
			if err := json.Unmarshal(ex.Result, &res); err != nil {
				t.Fatalf("the cell's result %s: %v", ex.Result, err)
			}
			if ex.Status != model.StatusKilled || res.EndedBy != engine.EndedByShutdown {
				t.Errorf("the running cell: got %s ended_by %q, want killed ended_by %q", ex.Status, res.EndedBy, engine.EndedByShutdown)
			}
			evs := env.events(t, "session.ended")
			if len(evs) != 1 || evs[0].Actor != "system" || !strings.Contains(evs[0].Reason, want) {
				t.Errorf("session.ended events: got %+v, want one by the system whose reason says %q", evs, want)
			}
		})
	}
}

// reapingDriver is a driver that keeps sessions without re-attaching
// them, whose Reap destroys the sandboxes its live sessions had and
// records what it was asked to reap.
type reapingDriver struct {
	*sandboxfake.Driver
	// live are the sessions a crashed daemon left behind, whose
	// sandboxes Reap destroys.
	live   []*engine.Session
	reaped []map[string]string
}

func (d *reapingDriver) Reap(ctx context.Context, match map[string]string) ([]string, error) {
	d.reaped = append(d.reaped, match)
	var ids []string
	for _, s := range d.live {
		if err := s.Close(ctx); err != nil {
			return ids, err
		}
		ids = append(ids, s.SandboxID())
	}
	d.live = nil
	return ids, nil
}

// TestSessionWithoutReattachEndsAtRestart serves sessions on a driver
// that cannot re-attach a sandbox (the docker and kubernetes drivers),
// whose daemon crashes: their cells ran, and the next daemon's start ends
// each interrupted, with a detail a user reads (on its record, in its
// session.ended event and in the refusal of its next cell), even one
// whose TTL has passed meanwhile (its sandbox died with its daemon, not
// at its TTL), and reaps their sandboxes by the daemon's owner label.
func TestSessionWithoutReattachEndsAtRestart(t *testing.T) {
	ctx := t.Context()
	t0 := time.Now()
	clock := &testClock{now: t0}
	drv := &sandboxfake.Driver{ID: "kubernetes", Tier: sandbox.TierGVisor, Sessions: true, NoReattach: true, Echo: true}
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{Now: clock.Now})
	var ids []string
	for _, ttl := range []time.Duration{time.Minute, 2 * time.Hour} {
		created, err := env.svc.CreateSession(ctx, env.agent, CreateSessionRequest{Runtime: "python", TTLMS: ttl.Milliseconds()}, CreateSessionOptions{})
		if err != nil {
			t.Fatalf("a session on a driver without Reattach: %v", err)
		}
		ss := created.Session
		ids = append(ids, ss.ID)
		inv, err := env.svc.ExecCell(ctx, env.agent, ss.ID, CellRequest{Code: "x = 1"}, InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := env.svc.Wait(ctx, env.agent, inv.Execution.ID, 10*time.Second); err != nil || got.Status != model.StatusSucceeded {
			t.Fatalf("a cell: got %+v, %v; want it succeeded", got, err)
		}
	}
	if specs := drv.Specs(); len(specs) != 2 || specs[0].Detached || specs[1].Detached {
		t.Fatalf("the sandboxes asked for: got %+v, want two not detached", specs)
	}
	// The daemon crashes: its claim on the database goes, its sessions
	// stay active, their sandboxes behind.
	restarted := &reapingDriver{Driver: drv}
	for _, id := range ids {
		restarted.live = append(restarted.live, env.svc.sessions.sessions.get(id).Session)
	}
	if err := env.svc.daemon.claim.Release(ctx); err != nil {
		t.Fatal(err)
	}

	clock.set(t0.Add(time.Hour)) // past the first session's TTL
	eng, err := engine.New(map[string]sandbox.Driver{drv.ID: restarted}, drv.ID, sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(eng, env.st, ServiceOptions{Now: clock.Now})
	if drv.Destroyed() != 0 {
		t.Fatalf("before the restart: %d sandboxes destroyed, want none", drv.Destroyed())
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(context.Background()) })
	const want = "the daemon restarted and driver kubernetes cannot re-attach a sandbox: " + noReattachWhy
	for i, id := range ids {
		got, err := env.st.GetSession(ctx, env.ws.ID, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != model.SessionEnded || got.EndReason != model.EndInterrupted || got.EndDetail != want {
			t.Errorf("session %d: got %s (%s: %q), want ended interrupted: %q", i, got.State, got.EndReason, got.EndDetail, want)
		}
	}
	if len(restarted.reaped) != 1 || restarted.reaped[0][engine.LabelOwner] != "stockade" || drv.Destroyed() != 2 {
		t.Errorf("Reap: got calls %v, %d sandboxes destroyed; want one call for the daemon's owner label, which destroyed the sessions' two", restarted.reaped, drv.Destroyed())
	}
	evs := env.events(t, "session.ended")
	if len(evs) != 2 || evs[0].Actor != "system" || !strings.Contains(evs[0].Reason, want) || !strings.Contains(evs[1].Reason, want) {
		t.Errorf("session.ended events: got %+v, want two by the system whose reasons say %q", evs, want)
	}
	_, err = svc.ExecCell(ctx, env.agent, ids[1], CellRequest{Code: "x"}, InvokeOptions{})
	var expired *SessionExpiredError
	if !errors.As(err, &expired) || !strings.Contains(err.Error(), want) {
		t.Errorf("a cell after the restart: got %v, want session_expired saying %q", err, want)
	}
}

// TestSessionWithoutReattachCloseIsBounded stops a daemon serving more
// sessions than it ends at a time on a driver that cannot re-attach a
// sandbox, whose cells run and whose destroys never finish (an API server
// that does not answer): Close still returns within its deadline, without
// an error, with every session recorded ended and every cell recorded
// killed by the shutdown; the sandboxes are left to the next start.
func TestSessionWithoutReattachCloseIsBounded(t *testing.T) {
	ctx := t.Context()
	hold, destroy := make(chan struct{}), make(chan struct{})
	defer close(hold)
	defer close(destroy)
	drv := &sandboxfake.Driver{ID: "kubernetes", Tier: sandbox.TierGVisor, Sessions: true, NoReattach: true, Echo: true, Hold: hold, HoldDestroy: destroy}
	const n = shutdownEnds + 4
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{Sessions: SessionOptions{MaxPerWorkspace: n}})
	if _, err := env.st.GrantCredits(ctx, env.ws.ID, 2*n, "test", nil); err != nil {
		t.Fatal(err)
	}
	var sessions, cells []string
	for range n {
		created, err := env.svc.CreateSession(ctx, env.agent, CreateSessionRequest{Runtime: "python"}, CreateSessionOptions{})
		if err != nil {
			t.Fatal(err)
		}
		inv, err := env.svc.ExecCell(ctx, env.agent, created.Session.ID, CellRequest{Code: "x = 1"}, InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sessions, cells = append(sessions, created.Session.ID), append(cells, inv.Execution.ID)
	}
	for _, id := range cells {
		env.waitStatus(t, id, model.StatusRunning)
	}
	const bound = 4 * time.Second
	closeCtx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	start := time.Now()
	err := env.svc.Close(closeCtx)
	if took := time.Since(start); err != nil || took >= bound {
		t.Fatalf("Close: got %v after %v, want it done within %v", err, took, bound)
	}
	if d := drv.Destroyed(); d != 0 {
		t.Fatalf("%d destroys finished, want none (they hold)", d)
	}
	for i, id := range sessions {
		got, err := env.st.GetSession(ctx, env.ws.ID, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != model.SessionEnded || got.EndReason != model.EndInterrupted {
			t.Errorf("session %d: got %s (%s), want ended interrupted", i, got.State, got.EndReason)
		}
		ex, err := env.st.GetExecution(ctx, env.ws.ID, cells[i])
		if err != nil {
			t.Fatal(err)
		}
		if ex.Status != model.StatusKilled {
			t.Errorf("session %d's cell: got %s, want killed", i, ex.Status)
		}
	}
}
