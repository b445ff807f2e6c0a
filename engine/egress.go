package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/syncctx"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// EgressHost is what the engine needs to give sandboxes egress: the
// sandbox networks, the egress proxy serving them and, optionally, the
// credential broker. It is built before the engine (NewEgressHost), which
// takes it with WithEgress, and it builds the proxy and the broker itself,
// so that their decisions and calls reach it from the start; it passes
// each on, with the labels of the sandbox concerned, to the observers set
// on the engine once they exist (SetEgressObserver, SetBrokerObserver).
// Until then they are dropped: only a sandbox makes them, and no sandbox
// runs before the engine. It is safe for concurrent use.
type EgressHost struct {
	nets   *netns.Manager
	proxy  *egress.Proxy
	broker *broker.Broker // nil: tools with credentials cannot run

	mu   sync.Mutex
	live map[string]map[string]string // sandbox id -> its labels, while it has egress

	observer       atomic.Pointer[func(EgressDecision)]
	brokerObserver atomic.Pointer[func(BrokerEvent)]
}

// NewEgressHost returns the egress host over nets, with a proxy built from
// pc and, unless bc is nil, a broker built from *bc: bc nil means tools
// with credentials cannot run. pc.OnDecision and bc.OnAudit must be nil
// (ErrInvalidArgument otherwise): the host receives the decisions and the
// calls, and hands them to the engine's observers.
func NewEgressHost(nets *netns.Manager, pc egress.Config, bc *broker.Config) (*EgressHost, error) {
	if nets == nil {
		return nil, errdefs.Publicf("an egress host needs the sandbox networks' manager: %w", errdefs.ErrInvalidArgument)
	}
	if pc.OnDecision != nil || (bc != nil && bc.OnAudit != nil) {
		return nil, errdefs.Publicf("the egress host receives the proxy's decisions and the broker's calls itself; observe them with the engine's SetEgressObserver and SetBrokerObserver: %w", errdefs.ErrInvalidArgument)
	}
	h := &EgressHost{nets: nets, live: map[string]map[string]string{}}
	pc.OnDecision = h.decided
	proxy, err := egress.New(pc)
	if err != nil {
		return nil, fmt.Errorf("building the egress proxy: %w", err)
	}
	h.proxy = proxy
	if bc != nil {
		c := *bc
		c.OnAudit = h.called
		if h.broker, err = broker.New(c); err != nil {
			return nil, fmt.Errorf("building the credential broker: %w", err)
		}
	}
	return h, nil
}

// WithEgress lets the engine give sandboxes egress through h: each sandbox
// with network gets a namespace from h's networks served by its proxy, and
// a tool that lists broker operations reaches h's broker. Without this
// option (or with h nil) a request for network fails with
// ErrFailedPrecondition.
func WithEgress(h *EgressHost) Option {
	return func(e *Engine) { e.egress = h }
}

// EgressAvailable reports whether the engine can give sandboxes egress.
func (e *Engine) EgressAvailable() bool { return e.egress != nil }

// EgressDecision is one decision of the egress proxy with the labels of the
// sandbox it concerns (nil when the sandbox has ended or is unknown).
type EgressDecision struct {
	egress.Decision
	Labels map[string]string
}

// SetEgressObserver makes f receive every decision of the proxy, with the
// sandbox's labels. f is called from the proxy's connection goroutines,
// concurrently, and must not block. Nil removes the observer.
func (e *Engine) SetEgressObserver(f func(EgressDecision)) {
	if e.egress == nil {
		return
	}
	if f == nil {
		e.egress.observer.Store(nil)
		return
	}
	e.egress.observer.Store(&f)
}

// decided hands a proxy decision to the observer; it is the proxy's
// Config.OnDecision. It never blocks beyond the observer.
func (h *EgressHost) decided(d egress.Decision) {
	f := h.observer.Load()
	if f == nil {
		return
	}
	(*f)(EgressDecision{Decision: d, Labels: h.labels(d.Sandbox)})
}

// BrokerEvent is one call of the credential broker with the labels of the
// sandbox that made it.
type BrokerEvent struct {
	broker.Event
	Labels map[string]string
}

// SetBrokerObserver makes f receive every call of the broker, with the
// sandbox's labels; the same rules as SetEgressObserver apply.
func (e *Engine) SetBrokerObserver(f func(BrokerEvent)) {
	if e.egress == nil {
		return
	}
	if f == nil {
		e.egress.brokerObserver.Store(nil)
		return
	}
	e.egress.brokerObserver.Store(&f)
}

// called hands a broker call to the observer; it is the broker's
// Config.OnAudit.
func (h *EgressHost) called(ev broker.Event) {
	f := h.brokerObserver.Load()
	if f == nil {
		return
	}
	(*f)(BrokerEvent{Event: ev, Labels: h.labels(ev.Sandbox)})
}

// labels returns the labels of the sandbox with egress id, nil once it has
// ended.
func (h *EgressHost) labels(id string) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.live[id]
}

// openEgress prepares the network of a sandbox of tool on drv: with
// network, the tool's allowlist; in every case the broker operations the
// tool lists. It returns the sandbox id to use and the prepared network,
// which the caller must Close.
func (e *Engine) openEgress(ctx context.Context, tool tools.Tool, drv sandbox.Driver, network bool, labels map[string]string) (string, *netns.Egress, error) {
	return e.openEgressWith(ctx, tool, drv, network, labels, false)
}

// openEgressWith is openEgress; kept makes a network that outlives the
// daemon (netns.Options.Kept), a session's.
func (e *Engine) openEgressWith(ctx context.Context, tool tools.Tool, drv sandbox.Driver, network bool, labels map[string]string, kept bool) (string, *netns.Egress, error) {
	if err := e.checkEgress(tool, drv); err != nil {
		return "", nil, err
	}
	h := e.egress
	id := sandbox.NewID()
	pol := egress.Policy{Sandbox: id, Tool: tool.Name}
	if network {
		if tool.Egress.None() {
			return "", nil, errdefs.Publicf("network access needs a tool whose record has an egress allowlist; tool %q has none: %w", tool.Name, errdefs.ErrPermissionDenied)
		}
		pol.Allow, pol.Ports = tool.Egress.Allow, tool.Egress.Ports
	}
	if len(tool.Credentials) > 0 {
		if h.broker == nil {
			return "", nil, errdefs.Publicf("tool %q lists broker operations, but no credential broker is configured: %w", tool.Name, errdefs.ErrFailedPrecondition)
		}
		pol.Broker = h.broker.Handler(broker.Caller{Sandbox: id, Tool: tool.Name, Operations: tool.Credentials})
	}
	// A driver that gives every sandbox a user namespace gets the network
	// in one made for the sandbox (see sandbox.EgressNet). The proxy and
	// the DNS responder serve until the session's Destroy closes them,
	// not until the request's context ends.
	n, err := h.nets.OpenEgressWith(context.WithoutCancel(ctx), h.proxy, pol, netns.Options{UserNamespace: drv.Capabilities().UserNamespace, Kept: kept})
	if err != nil {
		return "", nil, fmt.Errorf("preparing the network of sandbox %s: %w", id, err)
	}
	h.mu.Lock()
	h.live[id] = labels
	h.mu.Unlock()
	return id, n, nil
}

// checkEgress says whether the engine can give a sandbox of tool on drv
// a network: ErrFailedPrecondition when this host or drv cannot.
func (e *Engine) checkEgress(tool tools.Tool, drv sandbox.Driver) error {
	if e.egress == nil {
		return errdefs.Publicf("tool %q needs network, but egress is not available on this host (it needs root and nftables, and only the daemon enables it): %w", tool.Name, errdefs.ErrFailedPrecondition)
	}
	if !slices.Contains(drv.Capabilities().NetworkModes, sandbox.NetworkEgress) {
		return errdefs.Publicf("the %s driver cannot give a sandbox egress; run tool %q on the container or gvisor tier: %w", drv.Name(), tool.Name, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// providerAllowlist is the network of a sandbox of tool on drv when drv
// leaves the way out to its provider's policy (sandbox.NetworkAllowlist,
// and no NetworkEgress): ok is false for any other driver. With network
// it is the record's allowlist, which must not be empty; a tool that
// lists broker operations is refused, network or not: the broker is on
// this host, out of the provider's sandbox's reach.
func providerAllowlist(tool tools.Tool, drv sandbox.Driver, network bool) (allow []string, ports []int, ok bool, err error) {
	c := drv.Capabilities()
	if slices.Contains(c.NetworkModes, sandbox.NetworkEgress) || !slices.Contains(c.NetworkModes, sandbox.NetworkAllowlist) {
		return nil, nil, false, nil
	}
	switch {
	case len(tool.Credentials) > 0:
		return nil, nil, true, errdefs.Publicf("tool %q lists broker operations, which the %s driver's sandboxes cannot reach: %w", tool.Name, drv.Name(), errdefs.ErrFailedPrecondition)
	case network && tool.Egress.None():
		return nil, nil, true, errdefs.Publicf("network access needs a tool whose record has an egress allowlist; tool %q has none: %w", tool.Name, errdefs.ErrPermissionDenied)
	}
	return tool.Egress.Allow, tool.Egress.Ports, true, nil
}

// stopEgress stops the proxy and DNS responder of sandbox id, which
// decides every request still in flight, and only then forgets the
// sandbox's labels: every decision about the sandbox reaches the observers
// with its labels before stopEgress returns.
func (e *Engine) stopEgress(id string, n *netns.Egress) {
	n.Stop()
	e.egress.mu.Lock()
	delete(e.egress.live, id)
	e.egress.mu.Unlock()
}

// closeEgress stops and removes the network of sandbox id.
func (e *Engine) closeEgress(id string, n *netns.Egress) error {
	e.stopEgress(id, n)
	if err := n.Close(); err != nil {
		return fmt.Errorf("removing the network of sandbox %s: %w", id, err)
	}
	return nil
}

// closeEgressLater removes the network of sandbox id in the background:
// it costs about 30 ms (mostly the kernel's RCU grace periods for the veth
// and the nftables commit), which a caller waiting for a result should not
// pay. Wait waits
// for it. The sandbox must already be gone: nothing uses the network any
// more, so removing it later changes nothing but the time of the removal.
func (e *Engine) closeEgressLater(id string, n *netns.Egress) {
	e.closing.Go(func() {
		if err := e.closeEgress(id, n); err != nil {
			e.log.Error("removing a sandbox network failed; the daemon removes it at its next start", "sandbox", id, "err", err)
			e.closeMu.Lock()
			e.closeErrs = append(e.closeErrs, err)
			e.closeMu.Unlock()
		}
	})
}

// Wait waits until the networks of destroyed sandboxes are removed, and
// returns the errors of those removals since the last Wait (each is also
// logged). Call it when no sandbox is being destroyed any more, before the
// process exits: the service's Close does. It is safe to call again. ctx
// bounds the wait: when it ends first, Wait returns its cause, and the
// removals go on (a network left behind is removed at the next start).
func (e *Engine) Wait(ctx context.Context) error {
	if err := syncctx.Wait(ctx, &e.closing); err != nil {
		return fmt.Errorf("waiting for the sandbox networks' removal: %w", err)
	}
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	err := errors.Join(e.closeErrs...)
	e.closeErrs = nil
	return err
}

// Destroy destroys the sandbox and returns once it is gone and its proxy
// and DNS responder have decided every request they were serving (so that
// a caller that audits the decisions of a run has all of them when the run
// returns); the rest of its network (namespace, veth, rules) is removed
// afterwards in the background, and the engine's Wait waits for that. It
// is idempotent. The error is the sandbox's; a failure to remove the
// network is logged and returned by Wait.
func (s *Sandbox) Destroy(ctx context.Context) error {
	err := s.Sandbox.Destroy(ctx)
	if err == nil && s.unhold != nil {
		s.unhold()
	}
	if s.net != nil {
		s.netOnce.Do(func() {
			s.eng.stopEgress(s.Sandbox.ID(), s.net)
			s.eng.closeEgressLater(s.Sandbox.ID(), s.net)
		})
	}
	return err
}
