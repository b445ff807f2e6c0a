package storetest

import (
	"encoding/base64"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// testInvalidTextLookups looks rows up by keys that are not valid text, as
// a URL's escapes or the command line can make them: they find nothing, and
// filters and cursors made of them are refused, the same on every database
// (PostgreSQL refuses such parameters outright).
func testInvalidTextLookups(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "lookups")
	for _, key := range []string{"\xff", "ex_\x00", "a\xc3"} {
		_, err := st.GetExecution(ctx, f.ws.ID, key)
		wantClass(t, "GetExecution", err, errdefs.ErrNotFound)
		_, err = st.GetToolCall(ctx, f.ws.ID, key)
		wantClass(t, "GetToolCall", err, errdefs.ErrNotFound)
		_, err = st.GetApproval(ctx, f.ws.ID, key)
		wantClass(t, "GetApproval", err, errdefs.ErrNotFound)
		_, err = st.Apply(ctx, key, start("runc"))
		wantClass(t, "Apply", err, errdefs.ErrNotFound)
		_, err = st.Apply(ctx, key, decision(model.Execution{Status: model.StatusAwaitingApproval}, true, f.approver.ID, ""))
		wantClass(t, "Apply with an approval change", err, errdefs.ErrNotFound)
		_, err = st.GetWorkspace(ctx, key)
		wantClass(t, "GetWorkspace", err, errdefs.ErrNotFound)
		_, err = st.GetWorkspaceByName(ctx, key)
		wantClass(t, "GetWorkspaceByName", err, errdefs.ErrNotFound)
		_, err = st.ListEvents(ctx, f.ws.ID, store.EventFilter{Types: []string{key}})
		wantClass(t, "ListEvents by type", err, errdefs.ErrInvalidArgument)
		_, err = st.ListEvents(ctx, f.ws.ID, store.EventFilter{ExecutionID: key})
		wantClass(t, "ListEvents by execution", err, errdefs.ErrInvalidArgument)
		cursor := base64.RawURLEncoding.EncodeToString([]byte("1." + key))
		_, err = st.ListExecutions(ctx, f.ws.ID, store.ExecutionFilter{PageRequest: store.PageRequest{Cursor: cursor}})
		wantClass(t, "ListExecutions from a cursor", err, errdefs.ErrInvalidArgument)
		_, err = st.ListApprovals(ctx, f.ws.ID, store.ApprovalFilter{PageRequest: store.PageRequest{Cursor: cursor}})
		wantClass(t, "ListApprovals from a cursor", err, errdefs.ErrInvalidArgument)
	}
}
