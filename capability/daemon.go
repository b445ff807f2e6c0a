package capability

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// daemon is the service's life on this host: its claim on the database,
// the recovery from a previous daemon at start, the tick that expires
// approvals, sweeps sessions, writes key uses and witnesses the audit
// chains, and the last writes at Close.
type daemon struct {
	*core
	st daemonStore
	// claim is the store's daemon claim, taken by start.
	claim store.DaemonClaim
	// loop is the tick's goroutine.
	loop sync.WaitGroup

	runs      *runs
	sessions  *sessionHost
	snapshots *snapshots
	approvals *approvals
	tools     *toolRecords
	keys      *keyring
	egress    *egressAudit
}

// daemonStore is what daemon needs of the store.
type daemonStore interface {
	// ClaimDaemon takes the database's daemon claim for the service's
	// life.
	ClaimDaemon(ctx context.Context) (store.DaemonClaim, error)
	ListLiveExecutions(ctx context.Context) ([]model.Execution, error)
	Apply(ctx context.Context, id string, s model.Step) (model.Execution, error)
	// The witness's (witness.Chains).
	witness.Chains
	// For the checkpoints' gauge (observeCheckpoints).
	CheckpointBytes(ctx context.Context, workspaceID string) (bytes int64, paused int, err error)
}

// wait waits for the tick's goroutine, once the service's context ended.
func (s *daemon) wait() { s.loop.Wait() }

// stop makes the daemon's last writes (the key uses, the chains' witness),
// bounded by ctx (Close's: the service's own is cancelled by then), and
// releases the claim. Close may call it again: the second call only
// writes the key uses noted since.
func (s *daemon) stop(ctx context.Context) {
	s.keys.flushKeyUses(ctx)
	if s.claim != nil {
		// The last events of this daemon are witnessed too.
		s.witnessChains(ctx)
		if err := s.claim.Release(ctx); err != nil {
			s.log.Warn("releasing the database's daemon claim", "err", err)
		}
		s.claim = nil // Close may be called again
	}
}

// start claims the store for this daemon (ErrConflict while another daemon
// holds it; stop releases it), recovers from a previous daemon's crash and
// starts the approval expiry loop. Executions left queued or running end
// failed with their reservations released, and every sandbox labelled
// with this service's owner is destroyed.
func (s *daemon) start(ctx context.Context) (err error) {
	// Recovery fails every execution it finds running: it must not run
	// while another daemon serves the same database.
	claim, err := s.st.ClaimDaemon(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			claim.Release(context.WithoutCancel(ctx))
		}
	}()
	recovered, err := s.recover(ctx)
	if err != nil {
		return fmt.Errorf("recovering interrupted executions: %w", err)
	}
	// Sessions are re-attached before the orphans are reaped: Reap spares
	// the sandboxes Reattach returned.
	if err := s.sessions.adoptSessions(ctx); err != nil {
		return err
	}
	for name, d := range s.runner.Drivers() {
		r, ok := d.(sandbox.Reaper)
		if !ok {
			continue
		}
		ids, err := r.Reap(ctx, map[string]string{engine.LabelOwner: s.opts.Owner})
		if errdefs.IsUnavailable(err) {
			// A driver whose backend is down has no sandboxes to reap now;
			// it is reaped at the next start that finds it up.
			s.log.Warn("driver unavailable; orphaned sandboxes not reaped", "driver", name, "err", err)
			continue
		}
		if err != nil && name != s.runner.DefaultDriver() {
			// A driver other than the default serves only the tools whose
			// tier names it (a remote one is built whenever its token is
			// set): its failure, a refused token say, must not keep the
			// daemon from serving the rest. Its health says it fails.
			s.log.Warn("orphaned sandboxes not reaped", "driver", name, "count", len(ids), "err", err)
			continue
		}
		if err != nil {
			return fmt.Errorf("destroying orphaned %s sandboxes: %w", name, err)
		}
		if len(ids) > 0 {
			s.log.Info("destroyed orphaned sandboxes", "driver", name, "count", len(ids))
		}
	}
	if recovered > 0 {
		s.log.Info("recovered interrupted executions", "count", recovered)
	}
	if err := s.tools.recordTools(ctx); err != nil {
		return err
	}
	if err := s.approvals.countPending(ctx); err != nil {
		return err
	}
	s.claim = claim // before expireLoop reads it
	s.loop.Add(1)
	go s.expireLoop()
	s.egress.start()
	return nil
}

// recover ends every execution a previous daemon left queued or running,
// each in a transaction of its own with its execution.recovered event, so
// that no crash can leave a recovery unaudited, and returns how many it
// ended. Executions awaiting approval are left alone: their approval
// requests stay valid across a restart.
func (s *daemon) recover(ctx context.Context) (int, error) {
	live, err := s.st.ListLiveExecutions(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range live {
		step, err := Transition(GrantOf(e, nil), Interrupt{At: s.opts.Now()})
		if err != nil {
			return n, err
		}
		if _, err := s.st.Apply(ctx, e.ID, *step.Write); errdefs.IsConflict(err) {
			continue // it ended meanwhile
		} else if err != nil {
			return n, fmt.Errorf("recovering execution %s: %w", e.ID, err)
		}
		n++
	}
	return n, nil
}

// witnessEvery is how many ticks of expireLoop pass between witnesses of
// the audit chains' heads.
const witnessEvery = 10

func (s *daemon) expireLoop() {
	defer s.loop.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.approvals.expireApprovals(s.ctx)
			s.sessions.sweepSessions(s.ctx)
			if tick%witnessEvery == 0 {
				s.snapshots.sweepSnapshots(s.ctx)
			}
			s.keys.flushKeyUses(s.ctx)
			if tick%witnessEvery == 0 {
				s.witnessChains(s.ctx)
				s.checkClaim(s.ctx)
				s.observeCheckpoints(s.ctx)
			}
		}
	}
}

// checkClaim makes sure the daemon still holds the store's claim, taking it
// again if it was lost, and says so loudly if another daemon took it: that
// daemon's start failed this one's running executions.
func (s *daemon) checkClaim(ctx context.Context) {
	if err := s.claim.Check(ctx); err != nil && ctx.Err() == nil {
		s.log.Error("the database's daemon claim is lost: another stockade daemon may serve this database; stop one of them", "err", err)
	}
}

// witnessChains records the head of every audit chain in the witness
// directory. A failure is logged: the chains are witnessed again later. A
// head the chain does not link to the witnessed one is not recorded; it
// is logged and counted at every attempt, for as long as the chain stays
// so: the database was tampered with, or lost commits.
func (s *daemon) witnessChains(ctx context.Context) {
	refused, err := s.opts.Witness.RecordAll(ctx, s.st)
	for _, r := range refused {
		s.opts.Observer.WitnessRefused()
		s.log.Error("audit chain not witnessed", "workspace", r.Witnessed.WorkspaceID,
			"witnessed_seq", r.Witnessed.Seq, "broken_seq", r.Broken.Seq, "err", r)
	}
	if err != nil {
		s.log.Error("witnessing the audit chains", "dir", string(s.opts.Witness), "err", err)
	}
}

// CheckpointObserver is told, every few seconds, the disk that paused
// sessions' checkpoints and snapshots take and how many sessions are
// paused, over all workspaces. An Observer may implement it (api.Metrics
// does); the store is asked only then.
type CheckpointObserver interface {
	Checkpoints(bytes int64, paused int)
}

// observeCheckpoints tells the Observer, if it is a CheckpointObserver,
// the store's checkpoint bytes and paused sessions. A store that fails is
// logged; the next tick tries again.
func (s *daemon) observeCheckpoints(ctx context.Context) {
	o, ok := s.opts.Observer.(CheckpointObserver)
	if !ok {
		return
	}
	wss, err := s.st.ListWorkspaces(ctx)
	if err != nil {
		s.log.Warn("counting the checkpoints' bytes", "err", err)
		return
	}
	var bytes int64
	var paused int
	for _, ws := range wss {
		b, p, err := s.st.CheckpointBytes(ctx, ws.ID)
		if err != nil {
			s.log.Warn("counting the checkpoints' bytes", "workspace", ws.ID, "err", err)
			return
		}
		bytes, paused = bytes+b, paused+p
	}
	o.Checkpoints(bytes, paused)
}
