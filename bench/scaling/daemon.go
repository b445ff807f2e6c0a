package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// bounds is what the benchmark's daemon is configured to allow, beyond
// the defaults, so that the largest size fits: the sessions of one
// workspace, and the sandboxes' memory budget (counted by their memory
// limits). They are printed with the tables.
type bounds struct {
	sessions int
	budget   int64
}

// serve starts a daemon on d alone, as `stockade serve` wires one (the
// engine, the capability layer over SQLite, the HTTP API on a loopback
// listener) but with no warm pool, a session quota and a memory budget
// of b, and a workspace whose policy needs no approval and which has the
// credits given. It returns the workspace's agent client and a function
// that stops the daemon; sessions still open then stay running (as a
// daemon leaves them for its restart), so the caller ends them first.
func serve(ctx context.Context, d sandbox.Driver, images engine.Images, dir string, b bounds, credits int64) (client, func(), error) {
	eng, err := engine.New(map[string]sandbox.Driver{d.Name(): d}, d.Name(), images, sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		engine.WithMemoryBudget(b.budget))
	if err != nil {
		return client{}, nil, err
	}
	st, err := storeopen.Open(ctx, "sqlite:"+filepath.Join(dir, d.Name()+".db"))
	if err != nil {
		return client{}, nil, err
	}
	fail := func(err error) (client, func(), error) {
		st.Close()
		return client{}, nil, err
	}
	ws, err := st.CreateWorkspace(ctx, "bench", nil)
	if err != nil {
		return fail(err)
	}
	key := "sk_bench_" + rand.Text()
	if _, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: store.RoleAgent, Hash: store.HashKey(key), Name: "bench"}); err != nil {
		return fail(err)
	}
	p, err := st.GetPolicy(ctx, ws.ID)
	if err != nil {
		return fail(err)
	}
	p.Approval = store.ApprovalNone
	if _, err := st.SetPolicy(ctx, ws.ID, p, nil); err != nil {
		return fail(err)
	}
	if _, err := st.GrantCredits(ctx, ws.ID, credits, "benchmark", nil); err != nil {
		return fail(err)
	}
	svc := capability.NewService(eng, st, capability.ServiceOptions{Owner: "bench-scaling-" + d.Name(),
		Sessions: capability.SessionOptions{MaxPerWorkspace: b.sessions},
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := svc.Start(ctx); err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		svc.Close()
		return fail(err)
	}
	srv := &http.Server{Handler: api.New(svc, st, api.Options{}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	stop := func() {
		srv.Close()
		svc.Close()
		eng.Wait()
		st.Close()
	}
	// Every session's client keeps its connection between cells.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * b.sessions, IdleConnTimeout: time.Minute}}
	return client{base: "http://" + ln.Addr().String(), key: key, http: hc}, stop, nil
}

// client calls the daemon with the agent key.
type client struct {
	base, key string
	http      *http.Client
}

// session creates a python session and returns its id.
func (c client) session(ctx context.Context) (string, error) {
	var ses api.SessionView
	err := c.do(ctx, http.MethodPost, "/v1/sessions", capability.CreateSessionRequest{Runtime: "python"}, http.StatusCreated, &ses)
	return ses.ID, err
}

// end ends session id.
func (c client) end(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/sessions/"+id, nil, http.StatusOK, nil)
}

// cell runs code as a cell of session id and checks that it succeeds
// with stdout want (not checked when want is empty).
func (c client) cell(ctx context.Context, id, code, want string) error {
	var v api.CellView
	if err := c.do(ctx, http.MethodPost, "/v1/sessions/"+id+"/exec", capability.CellRequest{Code: code}, http.StatusOK, &v); err != nil {
		return err
	}
	if v.Status != "succeeded" || want != "" && v.Stdout != want {
		return fmt.Errorf("cell %q: got status %s, stdout %q, stderr %q; want succeeded, %q", code, v.Status, v.Stdout, v.Stderr, want)
	}
	return nil
}

func (c client) do(ctx context.Context, method, path string, body any, want int, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}
