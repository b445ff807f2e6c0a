package capability

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// serviceWith starts a service over st whose tools come from the YAML text.
// Egress is enabled in the tool options: the review gate is about records,
// not traffic.
func serviceWith(t *testing.T, st testStore, toolsYAML string) *Service {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(path, []byte(toolsYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := tools.Options{EgressSupported: true, Drivers: DriverCapabilities()}
	set, err := tools.Load(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	drivers := map[string]sandbox.Driver{"gvisor": &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}}
	eng, err := engine.New(drivers, "gvisor", sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling(), engine.WithTools(set, opts))
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(eng, st, ServiceOptions{})
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(context.Background()) })
	return svc
}

const fetchTool = `
tools:
  - name: fetch
    input_trust: trusted
    tier: gvisor
    egress:
      allow: [%s]
      ports: [443]
`

func fetchYAML(domains ...string) string {
	return strings.Replace(fetchTool, "%s", strings.Join(domains, ", "), 1)
}

func TestToolDrift(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	reviewWS, err := st.CreateWorkspace(ctx, "strict", nil)
	if err != nil {
		t.Fatal(err)
	}
	flagWS, err := st.CreateWorkspace(ctx, "relaxed", nil)
	if err != nil {
		t.Fatal(err)
	}
	principal := func(ws model.Workspace, role model.Role) Principal {
		k, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: role, Hash: model.HashKey(ws.Name + string(role))})
		if err != nil {
			t.Fatal(err)
		}
		return Principal{KeyID: k.ID, WorkspaceID: ws.ID, Role: role}
	}
	strictAgent, strictApprover, relaxedAgent := principal(reviewWS, model.RoleAgent), principal(reviewWS, model.RoleApprover), principal(flagWS, model.RoleAgent)
	for _, ws := range []model.Workspace{reviewWS, flagWS} {
		pol := model.DefaultPolicy()
		pol.Approval = model.ApprovalNone
		if ws.ID == reviewWS.ID {
			pol.ToolChanges = model.ToolChangesRequireReview
		}
		if _, err := st.SetPolicy(ctx, ws.ID, pol, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := st.GrantCredits(ctx, ws.ID, 100, "test", nil); err != nil {
			t.Fatal(err)
		}
	}
	toolEvents := func(typ string) []audit.ToolChangedEvent {
		var out []audit.ToolChangedEvent
		if err := eachEvent(ctx, st, "", []string{typ}, func(e model.Event) bool {
			var te audit.ToolChangedEvent
			if err := json.Unmarshal(e.Data, &te); err != nil {
				t.Fatal(err)
			}
			out = append(out, te)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	invoke := func(svc *Service, p Principal) error {
		inv, err := svc.Invoke(ctx, p, InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "fetch"}, InvokeOptions{})
		if err == nil {
			_, err = svc.Wait(ctx, p, inv.Execution.ID, 10e9)
		}
		return err
	}

	svc := serviceWith(t, st, fetchYAML("api.example.com"))
	if got := toolEvents(audit.ToolRegistered); len(got) != 2 { // fetch and the default tool
		t.Fatalf("tool.registered events: got %d, want 2 (%+v)", len(got), got)
	}
	if err := invoke(svc, strictAgent); err != nil {
		t.Fatalf("a tool never changed: got %v, want it to run", err)
	}
	svc.Close(t.Context())

	t.Run("unchanged reload writes nothing", func(t *testing.T) {
		svc := serviceWith(t, st, fetchYAML("api.example.com"))
		svc.Close(t.Context())
		if got := len(toolEvents(audit.ToolRegistered)) + len(toolEvents(audit.ToolChanged)); got != 2 {
			t.Errorf("tool events after an unchanged reload: got %d, want 2", got)
		}
	})

	t.Run("shrinking is audited, not flagged", func(t *testing.T) {
		svc := serviceWith(t, st, fetchYAML("api.example.com"))
		defer svc.Close(t.Context())
		_ = svc
	})

	svc = serviceWith(t, st, fetchYAML("api.example.com", "evil.example.net"))
	changed := toolEvents(audit.ToolChanged)
	if len(changed) != 1 {
		t.Fatalf("tool.changed events: got %d, want 1", len(changed))
	}
	c := changed[0]
	if !c.ReviewRequired || len(c.Growth) == 0 || !strings.Contains(strings.Join(c.Diff, "\n"), "evil.example.net") {
		t.Errorf("change event: got %+v, want review_required with the added domain in the diff", c)
	}
	// Every workspace's approvers see the change among their events: a
	// copy in each chain, naming the daemon's event it copies.
	head, err := st.ChainHead(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, ws := range []model.Workspace{reviewWS, flagWS} {
		var copies []audit.ToolChangedEvent
		if err := eachEvent(ctx, st, ws.ID, []string{audit.ToolChanged}, func(e model.Event) bool {
			var te audit.ToolChangedEvent
			if err := json.Unmarshal(e.Data, &te); err != nil {
				t.Fatal(err)
			}
			copies = append(copies, te)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if len(copies) != 1 || !copies[0].ReviewRequired || copies[0].Source == nil || copies[0].Source.Seq != head.Seq || copies[0].Source.Hash != head.Hash {
			t.Errorf("tool.changed in workspace %s: got %+v, want one copy of the daemon's event %d", ws.Name, copies, head.Seq)
		}
	}
	err = invoke(svc, strictAgent)
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "re-approve") {
		t.Errorf("require_review workspace, changed tool: got %v, want a denial asking for re-approval", err)
	}
	if err := invoke(svc, relaxedAgent); err != nil {
		t.Errorf("flag-only workspace, changed tool: got %v, want it to run", err)
	}
	if _, err := svc.ApproveTool(ctx, strictAgent, "fetch", "looks fine"); !errdefs.IsPermissionDenied(err) {
		t.Errorf("an agent approving a tool: got %v, want permission denied", err)
	}
	if _, err := svc.ApproveTool(ctx, strictApprover, "fetch", "reviewed the new domain"); err != nil {
		t.Fatal(err)
	}
	if err := invoke(svc, strictAgent); err != nil {
		t.Errorf("after re-approval: got %v, want it to run", err)
	}
	svc.Close(t.Context())

	t.Run("approval survives a restart", func(t *testing.T) {
		svc := serviceWith(t, st, fetchYAML("api.example.com", "evil.example.net"))
		if err := invoke(svc, strictAgent); err != nil {
			t.Errorf("after restart: got %v, want the re-approval to hold", err)
		}
	})

	t.Run("removal is audited", func(t *testing.T) {
		serviceWith(t, st, "tools: []\n")
		if got := toolEvents(audit.ToolRemoved); len(got) != 1 || got[0].Tool != "fetch" {
			t.Errorf("tool.removed events: got %+v, want one for fetch", got)
		}
	})
}

// TestApprovalOfAChangedTool refuses to approve a request whose tool record
// changed after the approver's card was made.
func TestApprovalOfAChangedTool(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	ws, err := st.CreateWorkspace(ctx, "cards", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GrantCredits(ctx, ws.ID, 10, "test", nil); err != nil {
		t.Fatal(err)
	}
	key := func(role model.Role) Principal {
		k, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: role, Hash: model.HashKey("cards" + string(role))})
		if err != nil {
			t.Fatal(err)
		}
		return Principal{KeyID: k.ID, WorkspaceID: ws.ID, Role: role}
	}
	agent, approver := key(model.RoleAgent), key(model.RoleApprover)
	svc := serviceWith(t, st, fetchYAML("api.example.com"))
	inv, err := svc.Invoke(ctx, agent, InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "fetch"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Approval == nil {
		t.Fatal("got no approval request under the default policy")
	}
	svc.Close(t.Context())

	svc = serviceWith(t, st, fetchYAML("api.example.com", "evil.example.net"))
	if _, _, err := svc.Decide(ctx, approver, inv.Approval.ID, true, "ok"); !errdefs.IsConflict(err) {
		t.Errorf("approving after the record changed: got %v, want a conflict", err)
	}
	if _, _, err := svc.Decide(ctx, approver, inv.Approval.ID, false, "the tool changed"); err != nil {
		t.Errorf("denying it: %v", err)
	}
}
