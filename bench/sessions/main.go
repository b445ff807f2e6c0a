// Command sessions measures a cell's round trip in a live session against
// the one-shot run of a program, side by side and interleaved in one run
// (so that machine noise hits every variant alike), on runc and gVisor,
// through the whole capability layer over HTTP on loopback with approval
// none: POST /v1/sessions/{id}/exec against POST /v1/executions.
//
// Until package kernel is wired into engine.KernelArgv, a session's kernel
// is the guest's test kernel for every runtime, so the cell is the test
// kernel's `print 1`, not python's print(1): the row measures everything
// a cell costs but the interpreter's own work (which for print(1) in a
// warm interpreter is microseconds).
//
// It needs root, runc, runsc and the images (`make setup`); it builds the
// stockade binary for the shim of the sessions' sandboxes, installs the
// guest in a temporary directory, keeps its state in a temporary
// directory under -state-dir and its SQLite store in another, listens on
// 127.0.0.1 only and stops by itself.
//
//	CGO_ENABLED=0 go run ./bench/sessions -n 200 -oneshot-n 20
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

func main() {
	n := flag.Int("n", 200, "cells timed per driver")
	oneshotN := flag.Int("oneshot-n", 20, "one-shot runs timed per driver (each round runs one of them for every n/oneshot-n cells)")
	dataDir := flag.String("data-dir", config.Default().DataDir, "image store")
	stateDir := flag.String("state-dir", "/run", "parent of the temporary state directory (a tmpfs, as in production)")
	flag.Parse()
	if err := run(*n, *oneshotN, *dataDir, *stateDir); err != nil {
		fmt.Fprintln(os.Stderr, "bench/sessions:", err)
		os.Exit(1)
	}
}

func run(n, oneshotN int, dataDir, stateDir string) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "stockade-bench-sessions-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "stockade")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/stockade").CombinedOutput(); err != nil {
		return fmt.Errorf("building the shim (run from the module root): %v\n%s", err, out)
	}
	guest, err := guestbin.Install(filepath.Join(tmp, "bin"))
	if err != nil {
		return err
	}
	state, err := os.MkdirTemp(stateDir, "stockade-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	shim := []string{bin, "shim"}
	rc, err := runc.New(runc.Config{StateDir: filepath.Join(state, "runc"), GuestPath: guest, Shim: shim})
	if err != nil {
		return err
	}
	gv, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(state, "gvisor"), GuestPath: guest, Shim: shim})
	if err != nil {
		return err
	}
	t := table.New("driver", "variant", "median", "p95", "median vs one-shot")
	t.Labels(2)
	for _, d := range []sandbox.Driver{rc, gv} {
		rows, err := measure(ctx, d, dataDir, tmp, n, oneshotN)
		if err != nil {
			return fmt.Errorf("%s: %w", d.Name(), err)
		}
		for _, r := range rows {
			t.Row(append([]string{d.Name()}, r...)...)
		}
	}
	t.Print(os.Stdout)
	return nil
}

// measure serves a daemon on d and times its variants.
func measure(ctx context.Context, d sandbox.Driver, dataDir, tmp string, n, oneshotN int) ([][]string, error) {
	eng, err := engine.New(map[string]sandbox.Driver{d.Name(): d}, d.Name(), image.Open(dataDir), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		return nil, err
	}
	st, err := storeopen.Open(ctx, "sqlite:"+filepath.Join(tmp, d.Name()+".db"))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	ws, err := st.CreateWorkspace(ctx, "bench", nil)
	if err != nil {
		return nil, err
	}
	key := "sk_bench_" + rand.Text()
	if _, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: store.RoleAgent, Hash: store.HashKey(key), Name: "bench"}); err != nil {
		return nil, err
	}
	p, err := st.GetPolicy(ctx, ws.ID)
	if err != nil {
		return nil, err
	}
	p.Approval = store.ApprovalNone
	if _, err := st.SetPolicy(ctx, ws.ID, p, nil); err != nil {
		return nil, err
	}
	if _, err := st.GrantCredits(ctx, ws.ID, int64(4*(n+oneshotN)+100), "benchmark", nil); err != nil {
		return nil, err
	}
	svc := capability.NewService(eng, st, capability.ServiceOptions{Owner: "bench-sessions-" + d.Name(),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := svc.Start(ctx); err != nil {
		return nil, err
	}
	defer svc.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: api.New(svc, st, api.Options{}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	c := client{base: "http://" + ln.Addr().String(), key: key, http: &http.Client{}}

	var ses api.SessionView
	if err := c.post("/v1/sessions", capability.CreateSessionRequest{Runtime: "python"}, http.StatusCreated, &ses); err != nil {
		return nil, err
	}
	defer c.do(http.MethodDelete, "/v1/sessions/"+ses.ID, nil, http.StatusOK, nil)
	cell := &table.Variant{Name: "cell `print 1` in a live session", Run: func() error {
		var v api.CellView
		if err := c.post("/v1/sessions/"+ses.ID+"/exec", capability.CellRequest{Code: "print 1"}, http.StatusOK, &v); err != nil {
			return err
		}
		if v.Status != "succeeded" || v.Stdout != "1\n" {
			return fmt.Errorf("cell: got %+v", v)
		}
		return nil
	}}
	oneshot := func(name, runtime, code string) *table.Variant {
		return &table.Variant{Name: name, Run: func() error {
			var v api.ExecutionView
			if err := c.post("/v1/executions", capability.InvokeRequest{Runtime: runtime, Code: code}, http.StatusOK, &v); err != nil {
				return err
			}
			if v.Status != "succeeded" || !bytes.Contains(v.Result, []byte(`"stdout": "1\n"`)) && !bytes.Contains(v.Result, []byte(`"stdout":"1\n"`)) {
				return fmt.Errorf("one-shot: got %s %s", v.Status, v.Result)
			}
			return nil
		}}
	}
	py := oneshot("one-shot python `print(1)`", "python", "print(1)")
	shell := oneshot("one-shot shell `echo 1`", "shell", "echo 1")
	// Each round runs every variant once: the cells get more rounds of
	// their own, interleaved with the one-shots' rounds.
	per := max(n/oneshotN, 1)
	for range oneshotN {
		if err := table.Interleave(1, []*table.Variant{py, shell}); err != nil {
			return nil, err
		}
		if err := table.Interleave(per, []*table.Variant{cell}); err != nil {
			return nil, err
		}
	}
	var rows [][]string
	for _, v := range []*table.Variant{cell, py, shell} {
		rows = append(rows, []string{v.Name, table.MS(v.Pct(50)), table.MS(v.Pct(95)), table.Ratio(v.Pct(50), py.Pct(50))})
	}
	return rows, nil
}

// client calls the daemon with the agent key.
type client struct {
	base, key string
	http      *http.Client
}

func (c client) post(path string, body any, want int, out any) error {
	return c.do(http.MethodPost, path, body, want, out)
}

func (c client) do(method, path string, body any, want int, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, r)
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
