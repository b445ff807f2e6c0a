package mcp_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/internal/daemontest"
	"github.com/stockade-sh/stockade/mcp"
	"github.com/stockade-sh/stockade/wire"
)

// TestStatelessPerKey checks that /mcp bounds the stateless requests one
// key has in flight by api.Options.MCPSessionsPerKey: one more is refused
// as resource exhausted while another key's is served, and a request
// whose client went frees its place (its handler ends with it). It checks
// too that subscriptions/listen, which can subscribe to nothing (the
// tool list never changes), answers at once instead of holding a place.
func TestStatelessPerKey(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{API: api.Options{MCPSessionsPerKey: 2, MCP: mcp.Options{ApprovalWait: time.Hour}}})
	ws, other := d.Workspace(t, nil, 100), d.Workspace(t, daemontest.NoApproval, 100)
	url := d.URL + "/mcp"

	// A listen stream asking for the tool list's changes is acknowledged
	// with none and ends; were it held open, this would time out.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	resp, err := http.DefaultClient.Do(statelessRequest(ctx, url, ws.Agent, "subscriptions/listen",
		map[string]any{"notifications": map[string]any{"toolsListChanged": true}}, false))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	cancel()
	if err != nil || !strings.Contains(string(body), `"id":1`) || strings.Contains(string(body), `"toolsListChanged":true`) {
		t.Fatalf("subscriptions/listen: got %q, %v; want it answered at once, subscribed to nothing", body, err)
	}

	// Two run_code calls that wait for an approver (an hour) fill the
	// key's places.
	approver, _ := client.New(d.URL, ws.Approver)
	var (
		wg      sync.WaitGroup
		cancels []context.CancelFunc
	)
	for range 2 {
		ctx, cancel := context.WithCancel(t.Context())
		cancels = append(cancels, cancel)
		wg.Go(func() {
			call := map[string]any{"name": "run_code", "arguments": map[string]any{"language": "python", "code": "print(1)"}}
			if resp, err := http.DefaultClient.Do(statelessRequest(ctx, url, ws.Agent, "tools/call", call, false)); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	t.Cleanup(func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
	})
	until(t, "two calls awaiting approval", func() bool {
		p, err := approver.ListApprovals(t.Context(), client.ApprovalFilter{Status: client.ApprovalPending})
		return err == nil && len(p.Items) == 2
	})

	status := func(key string) (int, string) {
		resp, err := http.DefaultClient.Do(statelessRequest(t.Context(), url, key, "tools/list", map[string]any{}, false))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return resp.StatusCode, string(b)
	}
	if code, body := status(ws.Agent); code != http.StatusTooManyRequests || !strings.Contains(body, "max_sessions_per_key") {
		t.Errorf("a third request of the key: got %d %s, want 429 naming mcp.max_sessions_per_key", code, body)
	} else {
		var e struct{ Error struct{ Code string } }
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != wire.CodeResourceExhausted {
			t.Errorf("a third request of the key: the error %s, want resource_exhausted", body)
		}
	}
	if code, body := status(other.Agent); code != http.StatusOK {
		t.Errorf("another key's request: got %d %s, want it served", code, body)
	}
	// The first call's client goes: its place frees once its handler ends.
	cancels[0]()
	until(t, "a place freed by a client gone", func() bool {
		code, _ := status(ws.Agent)
		return code == http.StatusOK
	})
}

// until polls ok until it holds, failing t if it does not within two
// minutes (a bound for a loaded machine, not a measure).
func until(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after two minutes", what)
		}
	}
}
