package capability

import (
	"context"
	"fmt"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// Under approval per_session, a session started from a snapshot (a fork)
// has its first cell approved anew unless the workspace's policy says
// fork_approval: inherit (model.ForkApprovalInherit); see docs/design.md
// §10. Then the fork inherits the approval that covered its source when
// the snapshot was taken, if one did:
//
//   - the policy is the one its opening was admitted under, and the fork's
//     own approval mode must be per_session (a fork opened under required
//     or none has nothing to inherit into);
//   - the source must have been opened under per_session and covered by
//     an approval decided no later than the snapshot was taken (its
//     record's time; a fork's own snapshot, taken in the same call, the
//     time the call began). A source covered only after the snapshot does
//     not pass the cover on: the snapshot holds none of what was approved;
//   - a source the store no longer has, or whose approval is gone, passes
//     nothing on: the fork's first cell is approved anew;
//   - the store records the fork covered in the transaction that opens it
//     and checks the approval is an approved one of the same workspace
//     (store.NewSession.ApprovalID);
//   - it is audited in the fork's session.forked: approval_id is the
//     approval inherited, and the reason names the source it was
//     inherited from. The fork's cells are then audited as any covered
//     cell (capability.invoke_allowed with covered_by).

// inheritApproval completes rec, the record of session f started from a
// snapshot under the claim c, with the approval it inherits from its
// source (see above), and appends its session.forked event.
func (f *fromSnapshot) inheritApproval(ctx context.Context, c *claim, rec *store.NewSession) error {
	ev := audit.SessionForkedEvent{Meta: audit.Meta{Actor: actorOf(c.by), Reason: "session started from a snapshot"},
		SessionID: f.id, SnapshotID: f.snapshotID, SourceID: f.source}
	if c.facts.pol.ForkApproval == model.ForkApprovalInherit && rec.Approval == model.ApprovalPerSession {
		id, err := f.sourceCover(ctx, c.by.WorkspaceID)
		if err != nil {
			return err
		}
		if id != "" {
			rec.ApprovalID, ev.ApprovalID = id, id
			ev.Reason = fmt.Sprintf("session started from a snapshot; approval %s inherited from session %s (fork_approval: inherit)", id, f.source)
		}
	}
	rec.Audit = append(rec.Audit, audit.NewEvent(ev))
	return nil
}

// sourceCover is the approval that covered f's source under per_session
// when its snapshot was taken, "" when none did.
func (f *fromSnapshot) sourceCover(ctx context.Context, workspaceID string) (string, error) {
	src, err := f.h.st.GetSession(ctx, workspaceID, f.source)
	switch {
	case errdefs.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("reading the source of a fork: %w", err)
	case src.Approval != model.ApprovalPerSession || src.ApprovalID == "":
		return "", nil
	}
	a, err := f.h.st.GetApproval(ctx, workspaceID, src.ApprovalID)
	switch {
	case errdefs.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("reading the approval of a fork's source: %w", err)
	case a.Status != model.ApprovalApproved, a.DecidedAt.IsZero(), f.taken.IsZero(), a.DecidedAt.After(f.taken):
		return "", nil
	}
	return a.ID, nil
}
