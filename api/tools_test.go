package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// toolSet loads a tools file holding yaml.
func toolSet(t *testing.T, yaml string) (*tools.Set, tools.Options) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := tools.Options{EgressSupported: true, Drivers: wiring.DriverCapabilities(config.Default())}
	set, err := tools.Load(file, opts)
	if err != nil {
		t.Fatal(err)
	}
	return set, opts
}

const fetchTools = `
tools:
  - name: fetch
    input_trust: trusted
    tier: container
    egress: {allow: [%s], ports: [443]}
`

// TestToolChangeSeenByApprovers restarts the daemon with a tool whose
// allowlist grew and checks that an approver of the workspace finds the
// tool.changed event that asks for a review with GET
// /v1/audit/events?type=tool.changed: it was written only to the chain of
// no workspace, which no key can list.
func TestToolChangeSeenByApprovers(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		before, opts := toolSet(t, strings.Replace(fetchTools, "%s", "api.example.com", 1))
		e := newEnv(t, b, envConfig{engine: []engine.Option{engine.WithTools(before, opts)}})
		e.svc.Close(t.Context())

		after, opts := toolSet(t, strings.Replace(fetchTools, "%s", "api.example.com, evil.example.net", 1))
		d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
		if err != nil {
			t.Fatal(err)
		}
		eng, err := engine.New(map[string]sandbox.Driver{"runc": d}, "runc", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
			engine.WithTools(after, opts))
		if err != nil {
			t.Fatal(err)
		}
		svc := capability.NewService(eng, e.st, capability.ServiceOptions{})
		if err := svc.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { svc.Close(context.Background()) })
		srv := httptest.NewServer(api.New(svc, e.st, api.Options{}))
		t.Cleanup(srv.Close)

		changed := list[wire.AuditEvent](t, srv.URL, e.approver, "/v1/audit/events", "type=tool.changed")
		if len(changed) != 1 {
			t.Fatalf("tool.changed events an approver lists: got %d, want the one change", len(changed))
		}
		var data struct {
			Tool           string   `json:"tool"`
			Growth         []string `json:"growth"`
			ReviewRequired bool     `json:"review_required"`
		}
		if err := json.Unmarshal(changed[0].Data, &data); err != nil {
			t.Fatal(err)
		}
		if changed[0].Code != "TOL002W" || data.Tool != "fetch" || !data.ReviewRequired || len(data.Growth) != 1 || !strings.Contains(data.Growth[0], "evil.example.net") {
			t.Errorf("the event: got code %s data %s, want the change of fetch asking for review of its growth", changed[0].Code, changed[0].Data)
		}
		var tv struct {
			Items []wire.Tool `json:"items"`
		}
		do(t, srv.URL, "GET", "/v1/tools", e.approver, nil).want(t, http.StatusOK).decode(t, &tv)
		for _, v := range tv.Items {
			if v.Name == "fetch" && !v.ReviewRequired {
				t.Errorf("GET /v1/tools: fetch not flagged review_required")
			}
		}
		if ok, broken, err := e.st.VerifyChain(t.Context(), e.ws.ID); !ok || err != nil {
			t.Errorf("the workspace's chain with the copy: ok %v, broken %+v, err %v", ok, broken, err)
		}
	})
}
