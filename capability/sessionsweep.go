package capability

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
)

// adoptSessions serves again, at the daemon's start, the sessions a
// previous daemon left active: each whose sandbox its driver re-attaches
// (with its kernel) is served; each other ends interrupted, with a detail
// saying why (lostDetail), or ttl when its TTL has passed and its driver
// re-attaches (its sandbox ended itself then: SandboxGrace). A session on
// a driver that cannot re-attach died with the daemon that opened it,
// whenever that was, so it always ends interrupted: a daemon that stops
// ends such sessions itself (endUnattached), so they are left only by a
// daemon that crashed, and their sandboxes are reaped next. A sandbox no
// active session names is destroyed (by the drivers' Reattach).
func (s *sessionHost) adoptSessions(ctx context.Context) error {
	active, err := s.st.ListActiveSessions(ctx)
	if err != nil {
		return fmt.Errorf("listing active sessions: %w", err)
	}
	bySandbox := map[string]model.Session{}
	for _, ss := range active {
		bySandbox[ss.SandboxID] = ss
	}
	lives, err := s.runner.ReattachSessions(ctx, map[string]string{engine.LabelOwner: s.opts.Owner}, func(id string) (engine.SessionSpec, bool) {
		ss, ok := bySandbox[id]
		return engine.SessionSpec{Runtime: ss.Runtime, Tool: ss.Tool, Network: ss.Network, Deadline: sandboxDeadline(ss.ExpiresAt)}, ok
	})
	if err != nil {
		s.log.Warn("re-attaching session sandboxes", "err", err)
	}
	adopted := map[string]bool{}
	for _, l := range lives {
		ss := bySandbox[l.SandboxID()]
		s.sessions.put(ss.ID, l)
		adopted[ss.ID] = true
	}
	s.sessionObserver().SessionsLive(len(lives))
	now, ended := s.opts.Now(), map[model.SessionEndReason]int{}
	for _, ss := range active {
		if adopted[ss.ID] {
			continue
		}
		// Past its TTL, its sandbox ended itself there (or would have):
		// the session ends as the daemon would have ended it. One on a
		// driver that cannot re-attach died with its daemon, before.
		reason, detail := model.EndInterrupted, s.lostDetail(ss)
		if !now.Before(ss.ExpiresAt) && s.runner.NoReattach(ss.Driver) == "" {
			reason, detail = model.EndTTL, ""
		}
		if _, err := s.endSession(ctx, ss, Principal{}, reason, detail, engine.EndedBySessionEnd); err != nil && !errdefs.IsFailedPrecondition(err) {
			return fmt.Errorf("ending session %s, whose sandbox is gone: %w", ss.ID, err)
		}
		ended[reason]++
	}
	if len(active) > 0 {
		s.log.Info("sessions after a restart", "served", len(lives), "interrupted", ended[model.EndInterrupted], "ttl", ended[model.EndTTL])
	}
	return s.sweepCheckpoints(ctx)
}

// lostDetail says why active session ss, which a restarted daemon does
// not serve again, was lost: its driver cannot re-attach a sandbox (a
// session on it lives as long as the daemon that opened it, and its
// sandbox is reaped now), or its sandbox was not found.
func (s *sessionHost) lostDetail(ss model.Session) string {
	if d := s.noReattachDetail(ss, "restarted"); d != "" {
		return d
	}
	return "the daemon restarted and found no live sandbox for it"
}

// noReattachDetail says, for the detail of session ss's end, that the
// daemon did what (stopped, restarted) and that ss's driver cannot
// re-attach a sandbox, and why; "" for a driver that can.
func (s *sessionHost) noReattachDetail(ss model.Session, did string) string {
	why := s.runner.NoReattach(ss.Driver)
	if why == "" {
		return ""
	}
	return fmt.Sprintf("the daemon %s and driver %s cannot re-attach a sandbox: %s", did, ss.Driver, why)
}

// endUnattached ends, as the daemon stops, every active session whose
// driver cannot re-attach a sandbox (engine.Engine.NoReattach), whatever
// sessions.on_shutdown says: its sandbox cannot outlive this daemon (its
// kernel ends with the daemon's stream to it), and left alone it would
// stay behind, stopped (a docker container, a kubernetes pod), and the
// session active, until a next start on the same database. Each ends as
// EndSessions ends a session, interrupted, with a detail saying why, and
// its sandbox is destroyed. It returns how many it ended. Close calls it
// once no request comes in any more and before the runs stop.
func (s *sessionHost) endUnattached(ctx context.Context) (int, error) {
	active, err := s.st.ListActiveSessions(ctx)
	if err != nil {
		return 0, fmt.Errorf("listing the sessions whose driver cannot re-attach: %w", err)
	}
	var lost []model.Session
	for _, ss := range active {
		if s.runner.NoReattach(ss.Driver) != "" {
			lost = append(lost, ss)
		}
	}
	return s.endAtShutdown(ctx, lost, func(ss model.Session) string { return s.noReattachDetail(ss, "stopped") })
}

// EndSessions ends every session of the daemon, active or paused, as the
// system (reason interrupted), for a daemon stopped for good (`stockade
// serve --sessions-on-shutdown=end`, or SIGUSR2): each as a session ends
// when deleted, audited, its sandbox destroyed and its running cell ended
// by that (killed, ended_by daemon_shutdown, charged as launched, with
// its output), its waiting cell cancelled and its checkpoint removed. It
// returns how many it ended; a session that ended meanwhile is not
// counted. The caller calls it before Close, with no requests coming in
// any more.
func (s *sessionHost) EndSessions(ctx context.Context) (int, error) {
	active, err := s.st.ListActiveSessions(ctx)
	if err != nil {
		return 0, fmt.Errorf("listing the sessions to end: %w", err)
	}
	paused, err := s.st.ListPausedSessions(ctx)
	if err != nil {
		return 0, fmt.Errorf("listing the sessions to end: %w", err)
	}
	return s.endAtShutdown(ctx, append(active, paused...), func(model.Session) string { return "" })
}

// shutdownEnds bounds how many sessions endAtShutdown ends at a time:
// each end destroys a sandbox, seconds on kubernetes.
const shutdownEnds = 8

// endAtShutdown ends sessions as the system, interrupted, each with
// detail's words, as the daemon stops; see EndSessions. It ends up to
// shutdownEnds at a time, each recorded ended before its sandbox is
// destroyed, so that a destroy that hangs (an API server that does not
// answer) neither holds the others back nor keeps the end unrecorded;
// ctx's destroy deadline (withDestroyDeadline), when it has one, bounds
// the destroys. It returns how many it ended.
func (s *sessionHost) endAtShutdown(ctx context.Context, sessions []model.Session, detail func(model.Session) string) (int, error) {
	var (
		mu   sync.Mutex
		n    int
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, shutdownEnds)
	)
	for _, ss := range sessions {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			_, err := s.endSession(ctx, ss, Principal{}, model.EndInterrupted, detail(ss), engine.EndedByShutdown)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				n++
			case !errdefs.IsFailedPrecondition(err):
				errs = append(errs, fmt.Errorf("ending session %s: %w", ss.ID, err))
			}
		}()
	}
	wg.Wait()
	return n, errors.Join(errs...)
}

// destroyDeadlineKey keys the deadline of the sandbox destroys of the
// sessions ended with a context (withDestroyDeadline).
type destroyDeadlineKey struct{}

// withDestroyDeadline returns ctx, with which a session's end destroys
// its sandbox only until by (endLocked): a destroy unfinished then is
// left to the next start's reap. Without it the destroy is unbounded, as
// a client gone must not leave a sandbox behind.
func withDestroyDeadline(ctx context.Context, by time.Time) context.Context {
	return context.WithValue(ctx, destroyDeadlineKey{}, by)
}

// destroyContext returns the context to destroy a session's sandbox with
// as ctx's end ends the session: never cancelled, and ending at ctx's
// destroy deadline if it has one.
func destroyContext(ctx context.Context) (context.Context, context.CancelFunc) {
	dctx := context.WithoutCancel(ctx)
	if by, ok := ctx.Value(destroyDeadlineKey{}).(time.Time); ok {
		return context.WithDeadline(dctx, by)
	}
	return dctx, func() {}
}

// sweepSessions ends the sessions past their hard lifetime (ttl), paused
// or not, and those no cell ran in for their idle timeout (idle_timeout;
// a session whose cell runs is not idle, a paused one neither). With
// PauseAfterIdle, a session that can pause is paused after so long idle
// instead (sweepPause).
func (s *sessionHost) sweepSessions(ctx context.Context) {
	active, err := s.st.ListActiveSessions(ctx)
	var paused []model.Session
	if err == nil {
		paused, err = s.st.ListPausedSessions(ctx)
	}
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("sweeping sessions", "err", err)
		}
		return
	}
	now := s.opts.Now()
	// The sessions past their TTL end first: an idle pause may take long
	// (pauseTimeout), and a session's sandbox ends itself SandboxGrace
	// after its TTL, cutting its cell short unrecorded by the daemon.
	var rest []model.Session
	for _, ss := range append(active, paused...) {
		if now.Before(ss.ExpiresAt) {
			rest = append(rest, ss)
			continue
		}
		s.sweepEnd(ctx, ss, model.EndTTL)
	}
	for _, ss := range rest {
		var reason model.SessionEndReason
		switch live := s.sessions.get(ss.ID); {
		case ss.State == model.SessionPaused || live != nil && live.running():
			continue
		case s.pausesWhenIdle(ss):
			if now.Before(ss.LastActiveAt.Add(s.opts.Sessions.PauseAfterIdle)) {
				continue
			}
			if err := s.sweepPause(ctx, ss); err == nil || now.Before(ss.IdleExpiresAt()) {
				continue
			}
			// A pause that keeps failing must not keep the sandbox until
			// the TTL: past its idle timeout too, the session ends as it
			// would without pause_after_idle.
			reason = model.EndIdle
		case !now.Before(ss.IdleExpiresAt()):
			reason = model.EndIdle
		default:
			continue
		}
		s.sweepEnd(ctx, ss, reason)
	}
}

// sweepEnd ends ss for reason, as the system.
func (s *sessionHost) sweepEnd(ctx context.Context, ss model.Session, reason model.SessionEndReason) {
	if _, err := s.endSession(ctx, ss, Principal{}, reason, "", engine.EndedBySessionEnd); err != nil && !errdefs.IsFailedPrecondition(err) && ctx.Err() == nil {
		s.log.Error("ending a session", "session", ss.ID, "reason", reason, "err", err)
	}
}

// pausesWhenIdle says whether active session ss is paused when idle
// (PauseAfterIdle) rather than ended.
func (s *sessionHost) pausesWhenIdle(ss model.Session) bool {
	return s.opts.Sessions.PauseAfterIdle > 0 && s.opts.Sessions.CheckpointDir != "" && s.runner.CanPause(ss.Driver) == nil && s.canSaveNetwork(ss, "pause") == nil
}

// sweepPause pauses ss, idle for PauseAfterIdle, as the system, unless a
// cell came meanwhile. It returns why the pause failed; nil also when the
// session was busy, changed or gone.
func (s *sessionHost) sweepPause(ctx context.Context, ss model.Session) error {
	unlock := s.trans.lock(ss.ID, true)
	defer unlock()
	cur, err := s.st.GetSession(ctx, ss.WorkspaceID, ss.ID)
	if err != nil || cur.State != model.SessionActive || !cur.LastActiveAt.Equal(ss.LastActiveAt) {
		return nil
	}
	_, err = s.pauseLocked(ctx, cur, Principal{})
	var busy *SessionBusyError
	if err == nil || ctx.Err() != nil || errors.As(err, &busy) {
		return nil
	}
	s.log.Error("pausing an idle session", "session", ss.ID, "err", err)
	return err
}
