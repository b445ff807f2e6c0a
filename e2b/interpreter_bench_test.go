package e2b

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/capability"
)

// BenchmarkInterpreterRoundTrip measures a cell of `1` in a warm python
// session on runc, side by side in one run, each over HTTP on loopback:
// through the interpreter (POST /execute, its NDJSON read to the end)
// and through Stockade's own session exec (POST /v1/sessions/{id}/exec,
// which answers once the cell ended).
func BenchmarkInterpreterRoundTrip(b *testing.B) {
	d := startTier(b, "runc")
	ws := d.workspace(b, noApproval, 1<<40)
	p, err := d.Service.Authenticate(b.Context(), ws.Agent)
	if err != nil {
		b.Fatal(err)
	}
	created, err := d.Service.CreateSession(b.Context(), p, capability.CreateSessionRequest{Runtime: "python"}, capability.CreateSessionOptions{})
	if err != nil {
		b.Fatal(err)
	}
	id := created.Session.ID
	b.Cleanup(func() { _, _ = d.Service.CloseSession(context.Background(), p, id) })
	h := NewInterpreter(d.Service, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(WithTarget(r.Context(), Target{SandboxID: "sb", SessionID: id, Principal: p, Runtime: "python"})))
	}))
	b.Cleanup(srv.Close)
	post := func(b *testing.B, url, key, want string) {
		req, _ := http.NewRequestWithContext(b.Context(), http.MethodPost, url, strings.NewReader(`{"code":"1"}`))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if !strings.Contains(string(body), want) {
			b.Fatalf("%s: got %d %s", url, res.StatusCode, body)
		}
	}
	b.Run("interpreter", func(b *testing.B) {
		for b.Loop() {
			post(b, srv.URL+"/execute", "", `"text":"1"`)
		}
	})
	b.Run("session-exec", func(b *testing.B) {
		for b.Loop() {
			post(b, d.URL+"/v1/sessions/"+id+"/exec", ws.Agent, `"data": "1"`)
		}
	})
}
