package storetest

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

func testWorkspaces(t *testing.T, st store.Store) {
	ctx := t.Context()
	b := must[model.Workspace](t, "CreateWorkspace(beta)")(st.CreateWorkspace(ctx, "beta", nil))
	a := must[model.Workspace](t, "CreateWorkspace(alpha)")(st.CreateWorkspace(ctx, "alpha", nil))
	if a.ID == b.ID || a.ID == "" || a.CreatedAt.IsZero() {
		t.Fatalf("workspaces: got %+v and %+v, want distinct ids and a creation time", a, b)
	}
	got := must[model.Workspace](t, "GetWorkspace")(st.GetWorkspace(ctx, a.ID))
	if got != a {
		t.Fatalf("GetWorkspace: got %+v, want %+v", got, a)
	}
	got = must[model.Workspace](t, "GetWorkspaceByName")(st.GetWorkspaceByName(ctx, "beta"))
	if got != b {
		t.Fatalf("GetWorkspaceByName: got %+v, want %+v", got, b)
	}
	all := must[[]model.Workspace](t, "ListWorkspaces")(st.ListWorkspaces(ctx))
	if len(all) != 2 || all[0] != a || all[1] != b {
		t.Fatalf("ListWorkspaces: got %+v, want alpha then beta", all)
	}
	p := must[model.Policy](t, "GetPolicy")(st.GetPolicy(ctx, a.ID))
	p.UpdatedAt = time.Time{}
	if !reflect.DeepEqual(p, model.DefaultPolicy()) {
		t.Fatalf("new workspace policy: got %+v, want %+v", p, model.DefaultPolicy())
	}
	wantCredits(t, st, a.ID, 0, 0)
	h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, a.ID))
	if h.Seq != 0 || h.Hash != "" {
		t.Fatalf("new workspace chain head: got %+v, want empty", h)
	}

	// A taken name is said in the user's words, not the database's
	// ("UNIQUE constraint failed: workspaces.name (2067)").
	_, err := st.CreateWorkspace(ctx, "alpha", nil)
	if want := `workspace "alpha" already exists: conflict`; err == nil || err.Error() != want {
		t.Errorf("CreateWorkspace of a taken name: got %v, want %q", err, want)
	}
	for _, tc := range []struct {
		name  string
		err   error
		class error
	}{
		{"duplicate name", err, errdefs.ErrConflict},
		{"empty name", second(st.CreateWorkspace(ctx, "  ", nil)), errdefs.ErrInvalidArgument},
		{"long name", second(st.CreateWorkspace(ctx, strings.Repeat("x", 300), nil)), errdefs.ErrInvalidArgument},
		{"NUL in name", second(st.CreateWorkspace(ctx, "a\x00b", nil)), errdefs.ErrInvalidArgument},
		{"unknown id", second(st.GetWorkspace(ctx, "ws_nope")), errdefs.ErrNotFound},
		{"unknown name", second(st.GetWorkspaceByName(ctx, "gamma")), errdefs.ErrNotFound},
		{"policy of unknown", second(st.GetPolicy(ctx, "ws_nope")), errdefs.ErrNotFound},
		{"credits of unknown", second(st.GetCredits(ctx, "ws_nope")), errdefs.ErrNotFound},
		{"chain head of unknown", second(st.ChainHead(ctx, "ws_nope")), errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) { wantClass(t, tc.name, tc.err, tc.class) })
	}
}

func second[T any](_ T, err error) error { return err }

func testAPIKeys(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "keys")
	other := newFixture(t, st, "other")

	got := must[model.APIKey](t, "LookupAPIKey")(st.LookupAPIKey(ctx, model.HashKey("keys/agent")))
	if got != f.agent || got.Role != model.RoleAgent || got.WorkspaceID != f.ws.ID || !got.RevokedAt.IsZero() {
		t.Fatalf("LookupAPIKey: got %+v, want %+v", got, f.agent)
	}
	keys := must[[]model.APIKey](t, "ListAPIKeys")(st.ListAPIKeys(ctx, f.ws.ID))
	if len(keys) != 3 {
		t.Fatalf("ListAPIKeys: got %d keys, want 3", len(keys))
	}

	if k := must[model.APIKey](t, "GetAPIKey")(st.GetAPIKey(ctx, f.approver.ID)); k != f.approver {
		t.Fatalf("GetAPIKey: got %+v, want %+v", k, f.approver)
	}

	// Uses are recorded where they are later than the one stored, so that
	// batches flushed out of order never move a last use back.
	t1 := store.TruncateTime(time.Now().Add(-time.Hour))
	t2 := t1.Add(time.Minute)
	for _, uses := range []map[string]time.Time{
		{f.agent.ID: t1, "key_unknown": t2},
		{f.agent.ID: t2, f.approver.ID: t1},
		{f.agent.ID: t1},
	} {
		if err := st.RecordKeyUses(ctx, uses); err != nil {
			t.Fatalf("RecordKeyUses(%v): %v", uses, err)
		}
	}
	for _, want := range []struct {
		id string
		at time.Time
	}{{f.agent.ID, t2}, {f.approver.ID, t1}, {f.adm.ID, time.Time{}}} {
		if k := must[model.APIKey](t, "GetAPIKey")(st.GetAPIKey(ctx, want.id)); !k.LastUsedAt.Equal(want.at) {
			t.Errorf("last use of %s: got %v, want %v", want.id, k.LastUsedAt, want.at)
		}
	}
	if k := must[model.APIKey](t, "LookupAPIKey")(st.LookupAPIKey(ctx, model.HashKey("keys/agent"))); !k.LastUsedAt.Equal(t2) {
		t.Errorf("LookupAPIKey: last use %v, want %v", k.LastUsedAt, t2)
	}

	// A revocation appends its audit event in its own transaction, once.
	revoked := func(k model.APIKey) []model.NewEvent {
		if k.RevokedAt.IsZero() {
			t.Errorf("audit of a revocation: got key %+v without RevokedAt", k)
		}
		return []model.NewEvent{{Type: "key.revoked", Actor: "test", Reason: k.ID}}
	}
	if err := st.RevokeAPIKey(ctx, f.ws.ID, f.agent.ID, revoked); err != nil {
		t.Fatalf("RevokeAPIKey: %v", err)
	}
	if err := st.RevokeAPIKey(ctx, f.ws.ID, f.agent.ID, revoked); err != nil {
		t.Fatalf("RevokeAPIKey twice: got %v, want success", err)
	}
	evs := must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{Types: []string{"key.revoked"}}))
	if len(evs.Items) != 1 || evs.Items[0].Reason != f.agent.ID {
		t.Errorf("key.revoked events: got %+v, want one naming %s", evs.Items, f.agent.ID)
	}
	_, err := st.LookupAPIKey(ctx, model.HashKey("keys/agent"))
	wantClass(t, "LookupAPIKey of a revoked key", err, errdefs.ErrNotFound)
	keys = must[[]model.APIKey](t, "ListAPIKeys")(st.ListAPIKeys(ctx, f.ws.ID))
	for _, k := range keys {
		if k.ID == f.agent.ID && k.RevokedAt.IsZero() {
			t.Fatalf("ListAPIKeys: revoked key has no RevokedAt")
		}
	}
	if k := must[model.APIKey](t, "GetAPIKey")(st.GetAPIKey(ctx, f.agent.ID)); k.RevokedAt.IsZero() {
		t.Errorf("GetAPIKey: revoked key has no RevokedAt")
	}

	for _, tc := range []struct {
		name  string
		err   error
		class error
	}{
		{"unknown hash", second(st.LookupAPIKey(ctx, model.HashKey("nope"))), errdefs.ErrNotFound},
		{"duplicate hash", second(st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: other.ws.ID, Role: model.RoleAgent,
			Hash: model.HashKey("keys/approver")})), errdefs.ErrConflict},
		{"unknown role", second(st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: f.ws.ID, Role: "root",
			Hash: model.HashKey("x")})), errdefs.ErrInvalidArgument},
		{"zero hash", second(st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: f.ws.ID, Role: model.RoleAgent})),
			errdefs.ErrInvalidArgument},
		{"unknown workspace", second(st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: "ws_nope", Role: model.RoleAgent,
			Hash: model.HashKey("y")})), errdefs.ErrNotFound},
		{"get unknown", second(st.GetAPIKey(ctx, "key_nope")), errdefs.ErrNotFound},
		{"revoke unknown", st.RevokeAPIKey(ctx, f.ws.ID, "key_nope", nil), errdefs.ErrNotFound},
		{"revoke another workspace's key", st.RevokeAPIKey(ctx, f.ws.ID, other.agent.ID, nil), errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) { wantClass(t, tc.name, tc.err, tc.class) })
	}
	if _, err := st.LookupAPIKey(ctx, model.HashKey("other/agent")); err != nil {
		t.Fatalf("a failed cross-workspace revoke revoked the key: %v", err)
	}
}

func testPolicy(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "policy")
	for _, tc := range []struct {
		name string
		in   model.Policy
		want model.Policy
	}{
		{
			name: "everything set",
			in: model.Policy{CodeExecution: true, Approval: model.ApprovalNone, NetworkAllowed: true,
				MaxTimeout: 10 * time.Second, Runtimes: []string{"python", "shell"}, ToolChanges: model.ToolChangesRequireReview,
				ForkApproval: model.ForkApprovalInherit},
			want: model.Policy{CodeExecution: true, Approval: model.ApprovalNone, NetworkAllowed: true,
				MaxTimeout: 10 * time.Second, Runtimes: []string{"python", "shell"}, ToolChanges: model.ToolChangesRequireReview,
				ForkApproval: model.ForkApprovalInherit},
		},
		{
			name: "zero value is the most restrictive",
			in:   model.Policy{},
			want: model.Policy{Approval: model.ApprovalRequired, Runtimes: []string{}, ToolChanges: model.ToolChangesFlag,
				ForkApproval: model.ForkApprovalAnew},
		},
		{
			name: "duplicate runtimes collapse",
			in:   model.Policy{CodeExecution: true, Runtimes: []string{"node", "node", "python"}},
			want: model.Policy{CodeExecution: true, Approval: model.ApprovalRequired, Runtimes: []string{"node", "python"},
				ToolChanges: model.ToolChangesFlag, ForkApproval: model.ForkApprovalAnew},
		},
		{
			name: "forks approved anew, set explicitly",
			in:   model.Policy{Approval: model.ApprovalPerSession, ForkApproval: model.ForkApprovalAnew},
			want: model.Policy{Approval: model.ApprovalPerSession, Runtimes: []string{}, ToolChanges: model.ToolChangesFlag,
				ForkApproval: model.ForkApprovalAnew},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := must[model.Policy](t, "SetPolicy")(st.SetPolicy(ctx, f.ws.ID, tc.in, nil))
			got := must[model.Policy](t, "GetPolicy")(st.GetPolicy(ctx, f.ws.ID))
			if got.UpdatedAt.IsZero() || !got.UpdatedAt.Equal(set.UpdatedAt) {
				t.Fatalf("UpdatedAt: got %v from Get and %v from Set", got.UpdatedAt, set.UpdatedAt)
			}
			got.UpdatedAt, set.UpdatedAt = time.Time{}, time.Time{}
			if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(set, tc.want) {
				t.Fatalf("policy: got %+v (Set returned %+v), want %+v", got, set, tc.want)
			}
			if got.RequiresApproval() != (tc.want.Approval != model.ApprovalNone) {
				t.Fatalf("RequiresApproval: got %v", got.RequiresApproval())
			}
		})
	}
	for _, tc := range []struct {
		name  string
		ws    string
		p     model.Policy
		class error
	}{
		{"unknown approval mode", f.ws.ID, model.Policy{Approval: "sometimes"}, errdefs.ErrInvalidArgument},
		{"unknown tool change mode", f.ws.ID, model.Policy{ToolChanges: "yolo"}, errdefs.ErrInvalidArgument},
		{"unknown fork approval mode", f.ws.ID, model.Policy{ForkApproval: "sometimes"}, errdefs.ErrInvalidArgument},
		{"negative timeout", f.ws.ID, model.Policy{MaxTimeout: -time.Second}, errdefs.ErrInvalidArgument},
		{"empty runtime", f.ws.ID, model.Policy{Runtimes: []string{""}}, errdefs.ErrInvalidArgument},
		{"unknown workspace", "ws_nope", model.DefaultPolicy(), errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := st.SetPolicy(ctx, tc.ws, tc.p, nil)
			wantClass(t, "SetPolicy", err, tc.class)
		})
	}
}
