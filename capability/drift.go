package capability

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// drift remembers which tools changed in a way that needs a human review,
// and which workspaces re-approved them.
type drift struct {
	mu sync.Mutex
	// pending maps a tool to the fingerprint whose change needs review.
	pending map[string]string
	// approved maps workspace and tool to the fingerprint re-approved.
	approved map[[2]string]string
	loaded   map[string]bool // workspaces whose approvals are loaded
}

func newDrift() drift {
	return drift{pending: map[string]string{}, approved: map[[2]string]string{}, loaded: map[string]bool{}}
}

// eachEvent pages through a chain's events of the given types, newest first,
// until fn returns false.
func eachEvent(ctx context.Context, st eventLister, ws string, types []string, fn func(model.Event) bool) error {
	f := store.EventFilter{PageRequest: store.PageRequest{Limit: store.MaxPageLimit}, Types: types}
	for {
		page, err := st.ListEvents(ctx, ws, f)
		if err != nil {
			return fmt.Errorf("reading audit events: %w", err)
		}
		for _, e := range page.Items {
			if !fn(e) {
				return nil
			}
		}
		if page.Next == "" {
			return nil
		}
		f.Cursor = page.Next
	}
}

// recordTools compares the loaded tools with the records the audit trail
// saw last, and writes an event for each tool registered, changed (with the
// diff, flagged review_required when an egress allowlist or credential list
// grew, or its template gained packages, wheels or files or turned npm
// install scripts on) or removed.
func (s *toolRecords) recordTools(ctx context.Context) error {
	type last struct {
		// ev is the event's data; a registration's and a removal's are
		// a change's without the fields of a change.
		ev  audit.ToolChangedEvent
		typ string
	}
	seen := map[string]*last{}
	err := eachEvent(ctx, s.st, "", []string{audit.ToolRegistered, audit.ToolChanged, audit.ToolRemoved}, func(e model.Event) bool {
		var te audit.ToolChangedEvent
		if json.Unmarshal(e.Data, &te) == nil && seen[te.Tool] == nil {
			seen[te.Tool] = &last{ev: te, typ: e.Type}
		}
		return true
	})
	if err != nil {
		return err
	}
	current := map[string]bool{}
	for _, t := range s.runner.Tools().Tools() {
		current[t.Name] = true
		fp, rec := tools.Fingerprint(t), tools.Canonical(t)
		prev := seen[t.Name]
		switch {
		case prev == nil || prev.typ == audit.ToolRemoved:
			err = s.appendToolEvent(ctx, t.Name, audit.ToolRegisteredEvent{Meta: audit.Meta{Actor: "system", Reason: "tool record loaded for the first time"},
				Tool: t.Name, Fingerprint: fp, Record: rec})
		case prev.ev.Fingerprint != fp:
			c, derr := tools.DiffStored(prev.ev.Record, t)
			if derr != nil {
				return derr
			}
			// A review still pending carries over a later change: an
			// unrelated edit must not clear it.
			if prev.typ == audit.ToolChanged && prev.ev.ReviewRequired {
				c.ReviewRequired = true
			}
			ev := audit.ToolChangedEvent{Meta: audit.Meta{Actor: "system", Reason: "tool record changed"},
				Tool: t.Name, Fingerprint: fp, PreviousFingerprint: prev.ev.Fingerprint, Record: rec, Growth: c.Growth, ReviewRequired: c.ReviewRequired}
			for _, f := range c.Fields {
				ev.Diff = append(ev.Diff, f.String())
			}
			ev.Template = templateChange(c, prev.ev.Record, t)
			if c.ReviewRequired {
				ev.Reason = "tool record changed and its reach grew: review required"
			}
			err = s.appendToolEvent(ctx, t.Name, ev)
			if c.ReviewRequired {
				s.drift.pending[t.Name] = fp
			}
		case prev.typ == audit.ToolChanged && prev.ev.ReviewRequired:
			// Unchanged since a change that needs review: still pending.
			s.drift.pending[t.Name] = fp
		}
		if err != nil {
			return err
		}
	}
	for name, prev := range seen {
		if !current[name] && prev.typ != audit.ToolRemoved {
			if err := s.appendToolEvent(ctx, name, audit.ToolRemovedEvent{Meta: audit.Meta{Actor: "system", Reason: "tool no longer configured"},
				Tool: name, Fingerprint: prev.ev.Fingerprint}); err != nil {
				return err
			}
		}
	}
	return nil
}

// templateChange is the audit form of the change of a tool's template
// declaration, or nil when it did not change. old is the record the
// audit trail saw last.
func templateChange(c tools.Change, old []byte, t tools.Tool) *audit.TemplateChange {
	if c.Template == nil {
		return nil
	}
	tc := c.Template
	ac := &audit.TemplateChange{Name: t.Template,
		DebianAdded: tc.DebianAdded, DebianRemoved: tc.DebianRemoved, NPMAdded: tc.NPMAdded, NPMRemoved: tc.NPMRemoved,
		WheelsAdded: tc.WheelsAdded, WheelsRemoved: tc.WheelsRemoved, FilesAdded: tc.FilesAdded, FilesRemoved: tc.FilesRemoved,
		Other: tc.Other, Grows: tc.Grows()}
	var rec struct {
		Template *struct {
			Name string `json:"name"`
		} `json:"template"`
	}
	if json.Unmarshal(old, &rec) == nil && rec.Template != nil && rec.Template.Name != t.Template {
		ac.PreviousName = rec.Template.Name
	}
	return ac
}

// appendToolEvent appends ev, an event of tool, to the unattributed chain.
// A change is also copied into every workspace's chain (store.AppendBroadcast),
// since any workspace may run the tool and its approvers must see the
// change, a review required above all, among their workspace's events.
func (s *toolRecords) appendToolEvent(ctx context.Context, tool string, ev audit.Event) error {
	var err error
	if c, ok := ev.(audit.ToolChangedEvent); ok {
		_, err = s.st.AppendBroadcast(ctx, audit.NewEvent(c), func(orig model.Event) model.NewEvent {
			c.Source = &audit.EventRef{Seq: orig.Seq, Hash: orig.Hash}
			return audit.NewEvent(c)
		})
	} else {
		_, err = s.st.AppendEvent(ctx, audit.NewEvent(ev))
	}
	if err != nil {
		return fmt.Errorf("auditing tool %q: %w", tool, err)
	}
	return nil
}

// reviewBlocks reports why a tool may not run for a workspace whose policy
// requires review of changed tools, or "" when it may.
func (s *toolRecords) reviewBlocks(ctx context.Context, ws, tool string) (string, error) {
	s.drift.mu.Lock()
	fp, pending := s.drift.pending[tool]
	loaded := s.drift.loaded[ws]
	s.drift.mu.Unlock()
	if !pending {
		return "", nil
	}
	if !loaded {
		approved := map[string]string{}
		err := eachEvent(ctx, s.st, ws, []string{audit.ToolReviewApproved}, func(e model.Event) bool {
			var re audit.ToolReviewApprovedEvent
			if json.Unmarshal(e.Data, &re) == nil {
				if _, ok := approved[re.Tool]; !ok {
					approved[re.Tool] = re.Fingerprint
				}
			}
			return true
		})
		if err != nil {
			return "", err
		}
		s.drift.mu.Lock()
		for t, f := range approved {
			s.drift.approved[[2]string{ws, t}] = f
		}
		s.drift.loaded[ws] = true
		s.drift.mu.Unlock()
	}
	s.drift.mu.Lock()
	defer s.drift.mu.Unlock()
	if s.drift.approved[[2]string{ws, tool}] == fp {
		return "", nil
	}
	return fmt.Sprintf("tool %q changed and its reach grew; the workspace requires review of changed tools: an approver must re-approve it (POST /v1/tools/%s/approve)", tool, tool), nil
}

// ToolStatus is a tool as an API caller sees it.
type ToolStatus struct {
	Tool           tools.Tool
	Fingerprint    string
	ReviewRequired bool // a change needs review and this workspace has not re-approved it
}

// Tools lists the tools with their review state for p's workspace.
func (s *toolRecords) Tools(ctx context.Context, p Principal) ([]ToolStatus, error) {
	var out []ToolStatus
	for _, t := range s.runner.Tools().Tools() {
		why, err := s.reviewBlocks(ctx, p.WorkspaceID, t.Name)
		if err != nil {
			return nil, err
		}
		out = append(out, ToolStatus{Tool: t, Fingerprint: tools.Fingerprint(t), ReviewRequired: why != ""})
	}
	return out, nil
}

// ApproveTool records that p's workspace re-approved a changed tool as it
// is now. Only approver and admin keys may.
func (s *toolRecords) ApproveTool(ctx context.Context, p Principal, name, reason string) (ToolStatus, error) {
	if p.Role != model.RoleApprover && p.Role != model.RoleAdmin {
		return ToolStatus{}, errdefs.Publicf("only approver or admin keys may approve tools: %w", errdefs.ErrPermissionDenied)
	}
	t, err := s.runner.Tools().Get(name)
	if err != nil {
		return ToolStatus{}, err
	}
	fp := tools.Fingerprint(t)
	if _, err := s.st.AppendEvent(ctx, audit.NewEvent(audit.ToolReviewApprovedEvent{
		Meta: audit.Meta{WorkspaceID: p.WorkspaceID, Actor: p.KeyID, Reason: reason}, Tool: t.Name, Fingerprint: fp,
	})); err != nil {
		return ToolStatus{}, fmt.Errorf("recording tool approval: %w", err)
	}
	s.drift.mu.Lock()
	s.drift.approved[[2]string{p.WorkspaceID, t.Name}] = fp
	s.drift.mu.Unlock()
	return ToolStatus{Tool: t, Fingerprint: fp}, nil
}
