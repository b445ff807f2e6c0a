package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// A session's sandbox with network (SessionSpec.Network, or a tool that
// lists broker operations) has a network namespace of its own, served by
// the egress proxy and DNS responder with its tool's allowlist, as a
// one-shot's (egress.go). The sandbox outlives the daemon, and so does
// its network: it is made kept (netns.Options.Kept), which the daemon's
// CleanupStale at start leaves, and named on the sandbox (LabelNet).
// ReattachSessions adopts the network of each sandbox it re-attaches and
// serves it again with the allowlist the session opened with, pinned on
// the sandbox (LabelEgress): an approval, and the session's decision,
// covered that list, and a restart of the daemon neither widens nor
// narrows it (a tool whose record no longer has egress ends the session
// instead). It removes the kept
// networks that no re-attached sandbox uses (RemoveKept): those of
// sandboxes gone meanwhile, or destroyed as no session's.

// LabelNet names the network namespace (netns.Net.Name) of a session's
// sandbox that has one, so that a restarted daemon that re-attaches the
// sandbox serves its network again.
const LabelNet = "stockade.netns"

// LabelEgress pins the egress allowlist and ports a session's sandbox
// opened with (pinnedEgress, JSON), which the proxy enforces for the
// session's life, across a restart of the daemon.
const LabelEgress = "stockade.egress"

// maxPinnedEgress bounds LabelEgress's value.
const maxPinnedEgress = 64 << 10

// pinnedEgress is the value of LabelEgress.
type pinnedEgress struct {
	Allow []string `json:"allow"`
	Ports []int    `json:"ports"`
}

// sessionNet is the network of a session's sandbox: as a one-shot's, but
// it lives as long as the session, across a restart of the daemon.
type sessionNet struct {
	*netns.Egress
	// allow says it has egress to the tool's allowlist; false: only the
	// broker.
	allow bool
	// pinned is the allowlist and ports the proxy enforces when allow.
	pinned pinnedEgress
	eng    *Engine
}

// openSessionNet prepares the network of a session's sandbox of tool on
// drv (openEgress) and sets spec's ID, network and LabelNet for it. The
// caller must close it (closeEgress) if the sandbox is not made.
func (e *Engine) openSessionNet(ctx context.Context, tool tools.Tool, drv sandbox.Driver, network bool, spec *sandbox.Spec) (*sessionNet, error) {
	id, n, err := e.openEgressWith(ctx, tool, drv, network, spec.Labels, true)
	if err != nil {
		return nil, err
	}
	labels := maps.Clone(spec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelNet] = n.Name
	sn := &sessionNet{Egress: n, allow: network, eng: e}
	if network {
		sn.pinned = pinnedEgress{Allow: slices.Clone(tool.Egress.Allow), Ports: slices.Clone(tool.Egress.Ports)}
		b, err := json.Marshal(sn.pinned)
		if err != nil || len(b) > maxPinnedEgress {
			_ = e.closeEgress(id, n)
			return nil, fmt.Errorf("pinning the egress allowlist of tool %q on its session (%d bytes): %v", tool.Name, len(b), err)
		}
		labels[LabelEgress] = string(b)
	}
	spec.ID, spec.Labels, spec.Network = id, labels, sandbox.NetworkEgress
	spec.Egress = &sandbox.EgressNet{NetNSPath: n.Path, ResolvConf: n.ResolvConf, UserNSPath: n.UserNSPath, HostIDBase: n.HostUIDBase}
	return sn, nil
}

// Egress returns the egress allowlist and ports the session's proxy
// enforces, pinned when it opened; none for a session without network
// or with only the broker's.
func (s *Session) Egress() (allow []string, ports []int) {
	if s.net == nil || !s.net.allow {
		return nil, nil
	}
	return slices.Clone(s.net.pinned.Allow), slices.Clone(s.net.pinned.Ports)
}

// closeNet stops the proxy and DNS responder of the session's network and
// removes it in the background, once; the sandbox must be gone.
func (s *Session) closeNet() {
	if s.net == nil {
		return
	}
	s.netOnce.Do(func() {
		s.net.eng.stopEgress(s.sb.ID(), s.net.Egress)
		s.net.eng.closeEgressLater(s.sb.ID(), s.net.Egress)
	})
}

// adoptNet serves again the network named by LabelNet of sb, re-attached
// for session spec (its Tool and Network), and returns it; a sandbox
// without the label has none (nil). The proxy's allowlist is the one
// pinned at the open (LabelEgress); a sandbox made before the pin has the
// tool's current record's.
func (e *Engine) adoptNet(ctx context.Context, sb sandbox.Sandbox, spec SessionSpec) (*sessionNet, error) {
	l, ok := sb.(labeled)
	if !ok {
		return nil, nil
	}
	labels := l.Labels()
	name := labels[LabelNet]
	if name == "" {
		return nil, nil
	}
	h := e.egress
	if h == nil {
		return nil, errors.New("it has a network, and egress is not available on this host any more")
	}
	n, err := h.nets.Adopt(name)
	if err != nil {
		return nil, err
	}
	tool, err := e.tools.Get(spec.Tool)
	if err != nil {
		_ = n.Remove()
		return nil, fmt.Errorf("serving its network: %w", err)
	}
	pol := egress.Policy{Sandbox: sb.ID(), Tool: tool.Name}
	if spec.Network {
		if tool.Egress.None() {
			_ = n.Remove()
			return nil, fmt.Errorf("its network was for tool %q's egress allowlist, which the tool's record no longer has", tool.Name)
		}
		pol.Allow, pol.Ports = tool.Egress.Allow, tool.Egress.Ports
		if v, ok := labels[LabelEgress]; ok {
			var pin pinnedEgress
			if len(v) > maxPinnedEgress || json.Unmarshal([]byte(v), &pin) != nil || len(pin.Allow) == 0 {
				_ = n.Remove()
				return nil, fmt.Errorf("its pinned egress allowlist (label %s) is not one", LabelEgress)
			}
			pol.Allow, pol.Ports = pin.Allow, pin.Ports
		}
	}
	if len(tool.Credentials) > 0 && h.broker != nil {
		pol.Broker = h.broker.Handler(broker.Caller{Sandbox: sb.ID(), Tool: tool.Name, Operations: tool.Credentials})
	}
	eg, err := h.nets.ServeEgress(context.WithoutCancel(ctx), h.proxy, pol, n)
	if err != nil {
		return nil, fmt.Errorf("serving the network of sandbox %s again: %w", sb.ID(), err)
	}
	h.mu.Lock()
	h.live[sb.ID()] = maps.Clone(labels)
	h.mu.Unlock()
	return &sessionNet{Egress: eg, allow: spec.Network, pinned: pinnedEgress{Allow: pol.Allow, Ports: pol.Ports}, eng: e}, nil
}

// removeUnusedNets removes the kept networks that no session of out
// uses, once the sessions are re-attached.
func (e *Engine) removeUnusedNets(out []*Session) {
	if e.egress == nil {
		return
	}
	keep := map[string]bool{}
	for _, s := range out {
		if s.net != nil {
			keep[s.net.Name] = true
		}
	}
	removed, err := e.egress.nets.RemoveKept(keep)
	if len(removed) > 0 {
		e.log.Info("removed the networks of session sandboxes that are gone", "count", len(removed))
	}
	if err != nil {
		e.log.Error("removing the networks of session sandboxes that are gone; the daemon tries again at its next start", "err", err)
	}
}
