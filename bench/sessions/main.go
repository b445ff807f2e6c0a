// Command sessions measures python cells in a live session against the
// one-shot runs of the same code and the bare interpreter, side by side and
// interleaved in one run (so that machine noise hits every variant alike),
// on runc and gVisor, through the whole capability layer over HTTP on
// loopback with approval none: POST /v1/sessions/{id}/exec against POST
// /v1/executions and `chroot ROOTFS python3 -c CODE`. The cells are
// `print(1)` and one using pandas, which an earlier cell of the session
// imported; the one-shots and the bare interpreter import it themselves.
// The sessions run their runtime's kernel (package kernel), as the daemon's
// do. It prints the table and whether the targets are met: a cell's
// round trip p50 at most 5 ms on runc and 10 ms on gVisor, the pandas cell
// at most 0.05x the one-shot that imports pandas. On gVisor it then
// pauses and resumes a session holding a 100 MiB DataFrame against a cold
// session rebuilding it (pause.go), and prints the checkpoints' sizes.
//
// It needs root, runc, runsc and the images (`make setup`); it builds the
// stockade binary for the shim of the sessions' sandboxes, installs the
// guest in a temporary directory, keeps its state in a temporary
// directory under -state-dir and its SQLite stores in another, listens on
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
	"github.com/stockade-sh/stockade/bench/internal/python"
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
	n := flag.Int("n", 200, "cells of each kind timed per driver")
	oneshotN := flag.Int("oneshot-n", 20, "rounds: each runs every one-shot and the bare interpreter once and n/oneshot-n cells of each kind")
	dataDir := flag.String("data-dir", config.Default().DataDir, "image store")
	stateDir := flag.String("state-dir", "/run", "parent of the temporary state directory (a tmpfs, as in production)")
	pauseN := flag.Int("pause-n", 10, "rounds of pause/resume against a cold rebuild (at most n)")
	flag.Parse()
	if err := run(*n, *oneshotN, min(*pauseN, *n), *dataDir, *stateDir); err != nil {
		fmt.Fprintln(os.Stderr, "bench/sessions:", err)
		os.Exit(1)
	}
}

// cellTargets are issue 15's targets for a cell's round trip p50, by
// driver; pandasTarget is its target for the pandas cell's, as a fraction
// of the one-shot that imports pandas.
var cellTargets = map[string]time.Duration{"runc": 5 * time.Millisecond, "gvisor": 10 * time.Millisecond}

const pandasTarget = 0.05

// row is one line of the table: a variant and the variants its median is
// compared with (nil: no comparison).
type row struct {
	driver        string
	v             *table.Variant
	oneShot, bare *table.Variant
}

func run(n, oneshotN, pauseN int, dataDir, stateDir string) error {
	ctx := context.Background()
	images := image.Open(dataDir)
	img, err := images.Resolve("python")
	if err != nil {
		return err
	}
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

	per := max(n/oneshotN, 1)
	bare := &table.Variant{Name: "bare `print(1)`", Run: python.Bare(img.Rootfs, python.Print, python.PrintOut)}
	barePandas := &table.Variant{Name: "bare, importing pandas", Run: python.Bare(img.Rootfs, python.PandasOneShot, python.PandasOut)}
	var rows []row
	// targets are, by driver, the cells and the one-shot held to them.
	type targets struct {
		driver                          string
		cell, cellPandas, oneShotPandas *table.Variant
	}
	var (
		checks   []targets
		gvClient client
	)
	for _, d := range []sandbox.Driver{rc, gv} {
		c, stop, err := serve(ctx, d, images, tmp, int64(4*(2*n+2*oneshotN)+100))
		if err != nil {
			return fmt.Errorf("%s: %w", d.Name(), err)
		}
		defer stop()
		if d == sandbox.Driver(gv) {
			gvClient = c
		}
		id, err := c.session()
		if err != nil {
			return fmt.Errorf("%s: %w", d.Name(), err)
		}
		defer c.do(http.MethodDelete, "/v1/sessions/"+id, nil, http.StatusOK, nil)
		if err := c.cell(id, python.PandasImport, ""); err != nil {
			return fmt.Errorf("%s: importing pandas in the session: %w", d.Name(), err)
		}
		oneShot := &table.Variant{Name: "one-shot `print(1)`", Run: c.oneShot(python.Print, python.PrintOut)}
		oneShotPandas := &table.Variant{Name: "one-shot importing pandas", Run: c.oneShot(python.PandasOneShot, python.PandasOut)}
		cell := &table.Variant{Name: "cell `print(1)` in a live session", Runs: per, Run: func() error {
			return c.cell(id, python.Print, python.PrintOut)
		}}
		cellPandas := &table.Variant{Name: "cell using pandas (imported by an earlier cell)", Runs: per, Run: func() error {
			return c.cell(id, python.PandasCell, python.PandasOut)
		}}
		checks = append(checks, targets{d.Name(), cell, cellPandas, oneShotPandas})
		rows = append(rows,
			row{d.Name(), cell, oneShot, bare},
			row{d.Name(), oneShot, nil, bare},
			row{d.Name(), cellPandas, oneShotPandas, barePandas},
			row{d.Name(), oneShotPandas, nil, barePandas})
	}
	rows = append(rows, row{"none", bare, nil, nil}, row{"none", barePandas, nil, nil})

	vs := make([]*table.Variant, len(rows))
	for i, r := range rows {
		vs[i] = r.v
	}
	if err := table.Interleave(oneshotN, vs); err != nil {
		return err
	}
	fmt.Printf("python over HTTP, approval none: %d rounds, each one run of every one-shot and bare variant and %d cells of each kind per driver, interleaved\n\n", oneshotN, per)
	t := table.New("driver", "variant", "median", "p95", "median vs one-shot", "median vs bare").Labels(2)
	ratio := func(v, base *table.Variant) string {
		if base == nil {
			return ""
		}
		return table.Ratio(v.Pct(50), base.Pct(50))
	}
	for _, r := range rows {
		t.Row(r.driver, r.v.Name, table.MS(r.v.Pct(50)), table.MS(r.v.Pct(95)), ratio(r.v, r.oneShot), ratio(r.v, r.bare))
	}
	t.Print(os.Stdout)

	fmt.Println("\nTargets:")
	for _, c := range checks {
		p50, limit := c.cell.Pct(50), cellTargets[c.driver]
		fmt.Printf("- %s: a cell's round trip p50 %s, at most %s: %s\n", c.driver, table.MS(p50), table.MS(limit), met(p50 <= limit))
		p50, base := c.cellPandas.Pct(50), c.oneShotPandas.Pct(50)
		fmt.Printf("- %s: the pandas cell %s the one-shot, at most %.2fx: %s\n", c.driver, table.Ratio(p50, base), pandasTarget, met(float64(p50) <= pandasTarget*float64(base)))
	}
	return pauseBench(gvClient, pauseN)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// serve starts a daemon on d alone, with a workspace whose policy needs no
// approval and which has credits for the run, and returns its agent
// client and a function that stops it.
func serve(ctx context.Context, d sandbox.Driver, images engine.Images, tmp string, credits int64) (client, func(), error) {
	eng, err := engine.New(map[string]sandbox.Driver{d.Name(): d}, d.Name(), images, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		return client{}, nil, err
	}
	st, err := storeopen.Open(ctx, "sqlite:"+filepath.Join(tmp, d.Name()+".db"))
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
	svc := capability.NewService(eng, st, capability.ServiceOptions{Owner: "bench-sessions-" + d.Name(),
		Sessions: capability.SessionOptions{CheckpointDir: filepath.Join(tmp, "checkpoints-"+d.Name())},
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
	return client{base: "http://" + ln.Addr().String(), key: key, http: &http.Client{}}, stop, nil
}

// session creates a python session and returns its id.
func (c client) session() (string, error) {
	var ses api.SessionView
	err := c.post("/v1/sessions", capability.CreateSessionRequest{Runtime: "python"}, http.StatusCreated, &ses)
	return ses.ID, err
}

// cell runs code as a cell of session id and checks that it succeeds
// with stdout want (not checked when want is empty).
func (c client) cell(id, code, want string) error {
	var v api.CellView
	if err := c.post("/v1/sessions/"+id+"/exec", capability.CellRequest{Code: code}, http.StatusOK, &v); err != nil {
		return err
	}
	if v.Status != "succeeded" || want != "" && v.Stdout != want {
		return fmt.Errorf("cell %q: got %+v", code, v)
	}
	return nil
}

// oneShot returns a Run of the one-shot python run of code, which must
// print want.
func (c client) oneShot(code, want string) func() error {
	return func() error {
		var v api.ExecutionView
		if err := c.post("/v1/executions", capability.InvokeRequest{Runtime: "python", Code: code}, http.StatusOK, &v); err != nil {
			return err
		}
		var res struct {
			Stdout string `json:"stdout"`
		}
		if v.Status != "succeeded" || json.Unmarshal(v.Result, &res) != nil || res.Stdout != want {
			return fmt.Errorf("one-shot %q: got %s %s", code, v.Status, v.Result)
		}
		return nil
	}
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
