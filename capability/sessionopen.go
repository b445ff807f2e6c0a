package capability

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// CreateSessionRequest is the body of POST /v1/sessions, as the wire
// declares it; its IdempotencyKey is not read (CreateSessionOptions
// carries it).
type CreateSessionRequest = wire.SessionRequest

// CreateSessionOptions are the parts of a creation that are not its body.
type CreateSessionOptions struct {
	// IdempotencyKey makes a retried creation return the first session.
	IdempotencyKey string
}

// Created is the outcome of CreateSession.
type Created struct {
	Session model.Session
	// Replayed is set when an Idempotency-Key matched an earlier
	// creation.
	Replayed bool
}

// lifetimes are the idle timeout and the TTL that req asks for, so's
// defaults when it names none, within so's ceilings (ErrInvalidArgument).
func lifetimes(so SessionOptions, req CreateSessionRequest) (idle, ttl time.Duration, err error) {
	if idle, err = durationOf("idle_timeout_ms", req.IdleTimeoutMS, so.IdleTimeout, so.MaxIdleTimeout); err != nil {
		return 0, 0, err
	}
	if ttl, err = durationOf("ttl_ms", req.TTLMS, so.TTL, so.MaxTTL); err != nil {
		return 0, 0, err
	}
	return idle, ttl, nil
}

func durationOf(name string, ms int64, def, ceiling time.Duration) (time.Duration, error) {
	switch {
	case ms == 0:
		return def, nil
	case ms < 0 || ms > math.MaxInt64/int64(time.Millisecond):
		return 0, errdefs.Publicf("%s %d is out of range: %w", name, ms, errdefs.ErrInvalidArgument)
	}
	d := time.Duration(ms) * time.Millisecond
	if d > ceiling {
		return 0, errdefs.Publicf("%s %d is above this server's ceiling of %d: %w", name, ms, ceiling.Milliseconds(), errdefs.ErrInvalidArgument)
	}
	return d, nil
}

// CreateSession opens a session for p: a decision of the workspace policy
// like an invocation's (recorded as session.created, or as
// capability.invoke_denied when refused), the workspace's bound of live
// sessions (QuotaError), then its sandbox and kernel. Nothing is left
// behind when it fails. A session costs nothing; its cells are charged as
// invocations.
func (s *sessionHost) CreateSession(ctx context.Context, p Principal, req CreateSessionRequest, o CreateSessionOptions) (*Created, error) {
	so := s.opts.Sessions
	network, err := policy.ParseNetwork(req.Network)
	if err != nil {
		return nil, err
	}
	idle, ttl, err := lifetimes(so, req)
	if err != nil {
		return nil, err
	}
	rec := &opening{h: s, id: NewSessionID(), reqSum: sha256Hex(mustJSON(req)), idle: idle, ttl: ttl,
		spec: engine.SessionSpec{Runtime: req.Runtime, Tool: req.Tool, Workspace: so.WorkspaceSize, Network: network}}
	// The decision first, before anything is created: a refusal leaves
	// only its event. (The record's driver and sandbox are filled in once
	// the sandbox exists, and the opening decided again with them.)
	if err := s.gate.admit(ctx, s.openingClaim(p, o, rec, rec, nil)); err != nil {
		return nil, err
	}
	return rec.created, nil
}

// openingClaim is the claim of op, a session's opening for p recorded by
// rec (op itself, or a start from a snapshot): its runtime, tool and
// network are op.spec's; its room is a place under the workspace's bound
// of live sessions (QuotaError), then more's when set (nil or the
// refusal), then the service's health.
func (s *sessionHost) openingClaim(p Principal, o CreateSessionOptions, op *opening, rec record, more func(context.Context, *claim, Admit) error) *claim {
	network := op.spec.Network
	c := &claim{by: p, grant: openingGrant(op.id), idempotencyKey: o.IdempotencyKey, replayFirst: true, egress: true, review: true, record: rec,
		ask:   policy.Request{Capability: contract.CodeExecute, Runtime: op.spec.Runtime, Network: network},
		asked: audit.Invocation{Capability: contract.CodeExecute.Name, Runtime: op.spec.Runtime, Network: policy.NetworkWord(network)},
		check: func() (tools.Tool, sandbox.Driver, error) {
			tool, drv, _, err := s.runner.CheckSession(op.spec)
			return tool, drv, err
		},
	}
	c.room = func(ctx context.Context, _ Step, in Admit) (*ticket, error) {
		if most, fits, err := s.sessionRoom(ctx, p.WorkspaceID, c.facts.pol, 1); err != nil {
			return nil, err
		} else if !fits {
			return nil, s.refuseQuota(ctx, c, in, most)
		}
		if more != nil {
			if err := more(ctx, c, in); err != nil {
				return nil, err
			}
		}
		return nil, s.gate.healthy(ctx, c, in)
	}
	return c
}

// opening records a session's opening (see claim): once the rules
// allowed it, its sandbox and kernel are made, then its record; nothing
// is left behind when that fails.
type opening struct {
	h  *sessionHost
	id string
	// reqSum is the hash of the request, which a retry must match.
	reqSum    string
	idle, ttl time.Duration
	spec      engine.SessionSpec

	// created is the outcome.
	created *Created
}

func (o *opening) replay(ctx context.Context, c *claim) (bool, error) {
	ss, err := o.h.st.ReplaySession(ctx, c.by.KeyID, c.idempotencyKey)
	if err == nil {
		if ss.RequestSHA256 != o.reqSum {
			return true, errdefs.Publicf("idempotency key %q was used for a different request (session %s): %w", c.idempotencyKey, ss.ID, errdefs.ErrConflict)
		}
		o.created = &Created{Session: ss, Replayed: true}
		return true, nil
	}
	if !errdefs.IsNotFound(err) {
		return false, fmt.Errorf("looking up the idempotency key: %w", err)
	}
	return false, nil
}

// input is the opening of the session that c asks for, decided in.
func (o *opening) input(c *claim, in Admit) Input {
	return OpenSession{Admit: in, Record: store.NewSession{ID: o.id, WorkspaceID: c.by.WorkspaceID, KeyID: c.by.KeyID, Tool: c.facts.tool.Name,
		Runtime: c.ask.Runtime, Network: c.ask.Network, Approval: c.facts.pol.Approval, IdleTimeout: o.idle, ExpiresAt: in.At.Add(o.ttl),
		WorkspaceBytes: o.h.opts.Sessions.WorkspaceSize, IdempotencyKey: c.idempotencyKey, RequestSHA256: o.reqSum, MaxLive: o.h.maxSessions(c.facts.pol)}}
}

// write makes the session's sandbox and records the session.
func (o *opening) write(ctx context.Context, c *claim, _ Step, in Admit, _ *ticket) error {
	open, spec := o.prepare(c, in)
	live, err := o.h.runner.OpenSession(ctx, spec)
	if err != nil {
		return fmt.Errorf("opening the session's sandbox: %w", err)
	}
	return o.record(ctx, c, in, open, live, nil)
}

// prepare is the opening c asks for, decided in, and the spec of its
// sandbox: the session's deadline and labels.
func (o *opening) prepare(c *claim, in Admit) (OpenSession, engine.SessionSpec) {
	open := o.input(c, in).(OpenSession)
	spec := o.spec
	spec.Deadline = sandboxDeadline(open.Record.ExpiresAt)
	spec.Labels = map[string]string{engine.LabelOwner: o.h.opts.Owner, engine.LabelSession: o.id, engine.LabelWorkspace: c.by.WorkspaceID, engine.LabelTool: open.Record.Tool}
	return open, spec
}

// record records open, whose sandbox live is made, decided again with
// the sandbox's driver and id, and completed by complete when set (a
// start from a snapshot adds its session.forked and what approval it
// inherits), and serves it; live is closed when that fails or the
// opening was a retry's.
func (o *opening) record(ctx context.Context, c *claim, in Admit, open OpenSession, live *engine.Session, complete func(*store.NewSession) error) error {
	s := o.h
	open.Record.Driver, open.Record.SandboxID = live.Driver, live.SandboxID()
	step, err := Transition(c.grant, open)
	if err == nil && step.Open == nil {
		err = fmt.Errorf("the session's decision changed while its sandbox was made")
	}
	var (
		ss       model.Session
		replayed bool
	)
	if err == nil {
		rec := *step.Open
		if complete != nil {
			err = complete(&rec)
		}
		if err == nil {
			ss, replayed, err = s.st.OpenSession(ctx, rec)
		}
	}
	if err != nil || replayed {
		_ = live.Close(context.WithoutCancel(ctx))
		switch {
		case replayed:
			o.created = &Created{Session: ss, Replayed: true}
			return nil
		case errdefs.IsResourceExhausted(err):
			return s.refuseQuota(ctx, c, in, open.Record.MaxLive)
		}
		return fmt.Errorf("recording the session: %w", err)
	}
	s.sessions.put(ss.ID, live)
	s.sessionObserver().SessionsLive(1)
	o.created = &Created{Session: ss}
	return nil
}

// openingGrant is the grant of session id before it opened.
func openingGrant(id string) Grant { return Grant{Kind: Session, Session: &SessionOf{ID: id}} }
