package capability

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/templates"
	"github.com/stockade-sh/stockade/tools"
)

// serviceWithTemplates starts a service over st whose tools and templates
// come from the YAML texts.
func serviceWithTemplates(t *testing.T, st testStore, toolsYAML, templatesYAML string) *Service {
	t.Helper()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tmpls, err := templates.Load(write("templates.yaml", templatesYAML), templates.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts := tools.Options{Drivers: DriverCapabilities(), Templates: tmpls}
	set, err := tools.Load(write("tools.yaml", toolsYAML), opts)
	if err != nil {
		t.Fatal(err)
	}
	drivers := map[string]sandbox.Driver{"gvisor": &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}}
	eng, err := engine.New(drivers, "gvisor", sandboxfake.Images{Templates: tmpls}, sandbox.DefaultLimits(), sandbox.DefaultCeiling(), engine.WithTools(set, opts))
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

const analystYAML = `
tools:
  - name: analyst
    runtimes: [python]
    input_trust: trusted
    tier: gvisor
    template: analytics
`

func analyticsYAML(packages ...string) string {
	return "templates:\n  - name: analytics\n    base: python\n    debian_packages: [" + strings.Join(packages, ", ") + "]\n"
}

// TestTemplateDrift changes the declaration of a tool's template between
// loads: an added package is a tool change carrying the template's diff
// and requiring review, so a workspace that requires review refuses the
// tool until an approver re-approves it; a removed package is audited
// without review.
func TestTemplateDrift(t *testing.T) {
	ctx := context.Background()
	type fixture struct {
		st              testStore
		agent, approver Principal
		toolEvents      func(typ string) []audit.ToolChangedEvent
		invoke          func(svc *Service) error
	}
	setup := func(t *testing.T) fixture {
		st := openSQLite(t)
		ws, err := st.CreateWorkspace(ctx, "strict", nil)
		if err != nil {
			t.Fatal(err)
		}
		pol := model.DefaultPolicy()
		pol.Approval = model.ApprovalNone
		pol.ToolChanges = model.ToolChangesRequireReview
		if _, err := st.SetPolicy(ctx, ws.ID, pol, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := st.GrantCredits(ctx, ws.ID, 100, "test", nil); err != nil {
			t.Fatal(err)
		}
		principal := func(role model.Role) Principal {
			k, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: role, Hash: model.HashKey(ws.Name + string(role))})
			if err != nil {
				t.Fatal(err)
			}
			return Principal{KeyID: k.ID, WorkspaceID: ws.ID, Role: role}
		}
		f := fixture{st: st, agent: principal(model.RoleAgent), approver: principal(model.RoleApprover)}
		f.toolEvents = func(typ string) []audit.ToolChangedEvent {
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
		f.invoke = func(svc *Service) error {
			inv, err := svc.Invoke(ctx, f.agent, InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "analyst"}, InvokeOptions{})
			if err == nil {
				_, err = svc.Wait(ctx, f.agent, inv.Execution.ID, 10e9)
			}
			return err
		}
		return f
	}

	t.Run("added package needs review", func(t *testing.T) {
		f := setup(t)
		svc := serviceWithTemplates(t, f.st, analystYAML, analyticsYAML("python3-bs4"))
		reg := f.toolEvents(audit.ToolRegistered)
		if i := slices.IndexFunc(reg, func(e audit.ToolChangedEvent) bool { return e.Tool == "analyst" }); i < 0 || !strings.Contains(string(reg[i].Record), `"template":{"name":"analytics","declaration":{`) {
			t.Fatalf("tool.registered of analyst: got %+v, want its record with the template's declaration", reg)
		}
		if err := f.invoke(svc); err != nil {
			t.Fatalf("a tool never changed: got %v, want it to run", err)
		}
		svc.Close(t.Context())

		svc = serviceWithTemplates(t, f.st, analystYAML, analyticsYAML("python3-bs4"))
		svc.Close(t.Context())
		if got := f.toolEvents(audit.ToolChanged); len(got) != 0 {
			t.Fatalf("an unchanged reload: got %d tool.changed events, want none", len(got))
		}

		svc = serviceWithTemplates(t, f.st, analystYAML, analyticsYAML("python3-bs4", "jq"))
		changed := f.toolEvents(audit.ToolChanged)
		if len(changed) != 1 {
			t.Fatalf("tool.changed events: got %d, want 1", len(changed))
		}
		c := changed[0]
		if !c.ReviewRequired || !slices.Contains(c.Growth, "template.debian_packages +jq") || !strings.Contains(strings.Join(c.Diff, "\n"), "template.debian_packages: [python3-bs4] -> [jq, python3-bs4] (+jq)") {
			t.Errorf("change event: got %+v, want review_required with the added package in growth and diff", c)
		}
		if c.Template == nil || !slices.Equal(c.Template.DebianAdded, []string{"jq"}) || !c.Template.Grows || c.Template.Name != "analytics" {
			t.Errorf("change event's template diff: got %+v, want jq added, growing", c.Template)
		}
		err := f.invoke(svc)
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "re-approve") {
			t.Errorf("changed template, workspace requiring review: got %v, want a denial asking for re-approval", err)
		}
		if _, err := svc.ApproveTool(ctx, f.approver, "analyst", "jq is fine"); err != nil {
			t.Fatal(err)
		}
		if err := f.invoke(svc); err != nil {
			t.Errorf("after re-approval: got %v, want it to run", err)
		}
	})

	t.Run("npm scripts turned on need review", func(t *testing.T) {
		const builderYAML = "tools:\n  - {name: builder, runtimes: [node], input_trust: trusted, tier: gvisor, template: web}\n"
		const webYAML = "templates:\n  - {name: web, base: node, npm_packages: [left-pad@1.3.0]"
		f := setup(t)
		serviceWithTemplates(t, f.st, builderYAML, webYAML+"}\n").Close(t.Context())
		svc := serviceWithTemplates(t, f.st, builderYAML, webYAML+", npm_scripts: true}\n")
		defer svc.Close(context.Background())
		changed := f.toolEvents(audit.ToolChanged)
		if len(changed) != 1 {
			t.Fatalf("tool.changed events: got %d, want 1", len(changed))
		}
		c := changed[0]
		if !c.ReviewRequired || !slices.Contains(c.Growth, "template.npm_scripts false -> true") || c.Template == nil || !c.Template.Grows {
			t.Errorf("change event: got %+v (template %+v), want review_required with npm_scripts in growth", c, c.Template)
		}
		ts, err := svc.Tools(ctx, f.agent)
		if err != nil {
			t.Fatal(err)
		}
		if i := slices.IndexFunc(ts, func(s ToolStatus) bool { return s.Tool.Name == "builder" }); i < 0 || !ts[i].ReviewRequired {
			t.Errorf("tools of a workspace requiring review: got %+v, want builder awaiting review", ts)
		}
	})

	t.Run("removed package is audited, not flagged", func(t *testing.T) {
		f := setup(t)
		serviceWithTemplates(t, f.st, analystYAML, analyticsYAML("python3-bs4", "jq")).Close(t.Context())
		svc := serviceWithTemplates(t, f.st, analystYAML, analyticsYAML("python3-bs4"))
		changed := f.toolEvents(audit.ToolChanged)
		if len(changed) != 1 {
			t.Fatalf("tool.changed events: got %d, want 1", len(changed))
		}
		c := changed[0]
		if c.ReviewRequired || len(c.Growth) != 0 || c.Template == nil || !slices.Equal(c.Template.DebianRemoved, []string{"jq"}) || c.Template.Grows {
			t.Errorf("change event: got %+v (template %+v), want jq removed without review", c, c.Template)
		}
		if err := f.invoke(svc); err != nil {
			t.Errorf("a shrunk template: got %v, want it to run", err)
		}
	})
}
