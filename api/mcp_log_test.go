package api_test

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// brokenExecutions is a store whose executions cannot be read: a cause the
// answer hides and the log must hold.
type brokenExecutions struct{ store.Store }

const brokenCause = "the disk caught fire"

func (brokenExecutions) GetExecution(context.Context, string, string) (model.Execution, error) {
	return model.Execution{}, errors.New(brokenCause)
}

// TestMCPSessionCallsLogTheirCause checks that in a stateful MCP session
// (a protocol before 2026-07-28) each later tool call whose answer hides
// an error logs its cause: the SDK serves them under the context of the
// request that started the session, whose line is long written.
func TestMCPSessionCallsLogTheirCause(t *testing.T) {
	st, err := storeopen.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "stockade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: "/nonexistent/stockade-guest"})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(map[string]sandbox.Driver{"runc": d}, "runc", image.Open(t.TempDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	ws, err := st.CreateWorkspace(t.Context(), "mcplog", nil)
	if err != nil {
		t.Fatal(err)
	}
	agent := "sk_test_mcplog_" + rand.Text()
	if _, err := st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey(agent), Name: "agent"}); err != nil {
		t.Fatal(err)
	}
	svc := capability.NewService(eng, brokenExecutions{st}, capability.ServiceOptions{})
	var logs testenv.Buffer
	srv := httptest.NewServer(api.New(svc, st, api.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
	t.Cleanup(srv.Close)

	tr := &sdk.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: &http.Client{Transport: bearer{key: agent}}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "stockade-test", Version: "1"}, nil).Connect(t.Context(), tr,
		&sdk.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	if cs.ID() == "" {
		t.Fatal("the session has no id: it is not a stateful one")
	}
	const calls = 3
	for range calls {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "wait_for_approval", Arguments: map[string]any{"execution_id": "ex_nope"}})
		cancel()
		if err != nil {
			t.Fatalf("calling wait_for_approval: %v", err)
		}
		if !res.IsError {
			t.Fatalf("wait_for_approval on a broken store: got no error: %+v", res)
		}
	}
	if got := strings.Count(logs.String(), brokenCause); got != calls {
		t.Errorf("the cause is logged %d times, want %d (once per call); log:\n%s", got, calls, logs.String())
	}
}

// bearer sends its key as the bearer token of each request.
type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}
