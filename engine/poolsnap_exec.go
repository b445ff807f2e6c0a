package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// A one-shot pool on a tier that saves sandboxes (sandbox.ExecRestorer:
// gVisor) refills from a checkpoint too, as a session pool does
// (poolsnap.go): its interpreter, pool.py, is saved while it waits for
// its program on its stdin, an Exec in flight that nothing was written
// to yet (sandboxkit.Guest.Freeze lets that one through), and each
// restore adopts it as the Exec of the restored sandbox
// (sandbox.ExecRestorer.RestoreExec; the guest keeps the exec, its
// pipes and its id across the restore, and the host's new client takes
// its frames by that id). The exec's timeout starts when it is adopted
// (the host keeps it, not the restored guest's clock), and the run's is
// the engine's (runWarm), from when its code is sent.
//
// What a restore shares with the checkpoint, and what is fresh, is as
// for a session pool's (poolsnap.go); the reseed is pool.py's own, once
// its program has come and before it runs: python's random, numpy's
// global RandomState and tempfile's name sequence are seeded from the
// kernel's random source, which a restored gVisor sandbox draws from the
// host afresh (os.urandom, uuid4 and secrets read it directly).

// A primer is a pooled Exec's stdin that takes bytes that are not the
// program (pool.py's warm header) without starting the run's CPU count
// (sandboxkit's codeStdin).
type primer interface{ Prime(p []byte) error }

// restoreExec restores a sandbox of p, a one-shot pool, from the
// checkpoint in dir, of the image of digest, its interpreter adopted.
func (p *pool) restoreExec(ctx context.Context, dir, digest string) (_ *warm, err error) {
	w := &warm{born: time.Now(), image: digest, log: p.e.log}
	snap := p.snap.snap.(sandbox.ExecRestorer)
	// The Exec lives as long as the sandbox (see create): ResumeExec
	// does not end it with ctx.
	sb, ex, err := snap.RestoreExec(ctx, dir, nil, p.interpreter(w, p.argv, templateEnv(nil)))
	if err != nil {
		return nil, err
	}
	w.sb, w.ex = sb, ex
	// Its memory is mapped in as the interpreter touches it: pool.py
	// touches it all now (its _warm), while the sandbox waits, rather
	// than the program on its first milliseconds.
	// The warm-up is written so that the run's CPU time is counted from
	// its program's first write, not from the warm-up (primer).
	pr, ok := ex.Stdin().(primer)
	if p.e.poolOpts.Unwarmed || !ok {
		return w, nil
	}
	if err := pr.Prime(warmHeader); err != nil {
		_ = sb.Destroy(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("warming the restored interpreter: %w", err)
	}
	if d, ok := sb.(sandbox.Deadliner); ok {
		// A restored sandbox is detached: one a killed daemon left
		// behind ends by itself a minute after the longest run begun
		// just before the pool would have retired it, as the Exec's own
		// timeout allows (newPool: the pool hands out its oldest first).
		if err := d.SetDeadline(ctx, w.born.Add(p.created.Timeout)); err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return w, nil
}

// settle waits until w's interpreter, which a one-shot pool just
// started, waits for its program: pool.py says nothing when it has
// imported numpy and pandas (its output is the run's), so the sandbox's
// CPU time is watched until it stops growing (settleQuiet in each of
// settleRounds rounds of settleTick; an idle gVisor sandbox uses about
// 4 ms a second). A checkpoint taken before would hold a half-imported
// interpreter, which every restore would finish importing.
func settle(ctx context.Context, w *warm) error {
	last, ok := cpuOf(w.sb)
	if !ok {
		return errors.New("the sandbox's CPU time cannot be read: its interpreter's readiness is unknown")
	}
	deadline := time.Now().Add(settleMax)
	quiet := 0
	for quiet < settleRounds {
		if time.Now().After(deadline) {
			return fmt.Errorf("the pool's interpreter was still busy after %s", settleMax)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(settleTick):
		}
		if w.ended() {
			return errors.New("the pool's interpreter ended before its program came")
		}
		now, _ := cpuOf(w.sb)
		if now-last < settleQuiet {
			quiet++
		} else {
			quiet = 0
		}
		last = now
	}
	return nil
}

// warmHeader makes pool.py map its memory in before its program comes.
var warmHeader = func() []byte {
	h := []byte(`{"warm": true}`)
	return append(poolHeaderLen(len(h)), h...)
}()

const (
	settleTick   = 100 * time.Millisecond
	settleQuiet  = 5 * time.Millisecond
	settleRounds = 3
	settleMax    = time.Minute
)
