package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/wire"
)

// crashDaemonEnv, set to a directory, makes the test binary the daemon of
// TestKillLoop over the database in that directory instead of running
// tests.
const crashDaemonEnv = "STOCKADE_TEST_CRASH_DAEMON"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashDaemonEnv); dir != "" {
		os.Exit(crashDaemon(dir))
	}
	os.Exit(m.Run())
}

// crashDaemon is what stockade serve wires, over the SQLite database and
// the witness directory in dir, with the fake sandbox driver (slowed down
// so that invocations are in flight when the test kills it): what
// TestKillLoop puts under test is the store and the capability layer's
// recovery, not a sandbox runtime. It serves until SIGTERM, then shuts down
// as the daemon does.
func crashDaemon(dir string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	fail := func(err error) int {
		log.Error("crash daemon", "err", err)
		return 1
	}
	st, err := storeopen.Open(ctx, storeopen.DefaultURL(dir))
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	drivers := map[string]sandbox.Driver{"gvisor": slowDriver{&sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}}}
	eng, err := engine.New(drivers, "gvisor", sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		return fail(err)
	}
	svc := capability.NewService(eng, st, capability.ServiceOptions{Owner: "kill-loop", MaxConcurrent: 8, Logger: log,
		Witness: witness.Dir(filepath.Join(dir, "witness"))})
	if err := svc.Start(ctx); err != nil {
		return fail(err)
	}
	defer svc.Close(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	srv := &http.Server{Handler: api.New(svc, st, api.Options{})}
	go srv.Serve(ln)
	log.Info("stockade serving", "listen", ln.Addr().String())
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return 0
}

// slowDriver is the fake driver whose execs start up to 30 ms late, so
// that a kill finds some running.
type slowDriver struct{ *sandboxfake.Driver }

func (d slowDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return slowSandbox{sb}, nil
}

type slowSandbox struct{ sandbox.Sandbox }

func (s slowSandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Exec, error) {
	select {
	case <-time.After(time.Duration(rand.IntN(30)) * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Sandbox.Start(ctx, req)
}

// TestKillLoop kills a daemon with SIGKILL 50 times while clients invoke
// through it, restarting it each time, and checks that every restart
// leaves no credits reserved, and at the end that the ledger adds up
// (granted - committed = available + reserved), that what it committed is
// what the tool_calls rows charge, that every execution a client was
// answered succeeded is recorded succeeded and charged, and that the audit
// chain verifies against its witness.
func TestKillLoop(t *testing.T) {
	const (
		cycles  = 50
		clients = 6
		granted = 1_000_000
	)
	// Bounds the loop: 50 cycles take about 30 s on a quiet machine.
	deadline := time.Now().Add(4 * time.Minute)
	dir := t.TempDir()
	st, err := storeopen.Open(t.Context(), storeopen.DefaultURL(dir))
	if err != nil {
		t.Fatal(err)
	}
	ws, err := st.CreateWorkspace(t.Context(), "kill-loop", nil)
	if err != nil {
		t.Fatal(err)
	}
	key := "sk_test_agent_" + fmt.Sprint(rand.Int64())
	if _, err := st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey(key), Name: "agent"}); err != nil {
		t.Fatal(err)
	}
	p, err := st.GetPolicy(t.Context(), ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	p.Approval = model.ApprovalNone
	if _, err := st.SetPolicy(t.Context(), ws.ID, p, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GrantCredits(t.Context(), ws.ID, granted, "kill loop", nil); err != nil {
		t.Fatal(err)
	}
	st.Close()

	start := func() *daemon {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashDaemonEnv+"="+dir)
		d := startProcess(t, cmd)
		// Recovery at start settled whatever the killed daemon had
		// reserved.
		var v wire.Workspace
		do(t, d.url, "GET", "/v1/workspace", key, nil).want(t, http.StatusOK).decode(t, &v)
		if v.Credits.Reserved != 0 || v.Credits.Available+v.Credits.Reserved > granted {
			t.Fatalf("credits after a restart: got available %d reserved %d, want none reserved", v.Credits.Available, v.Credits.Reserved)
		}
		return d
	}
	var (
		mu    sync.Mutex
		acked []string // executions answered succeeded
	)
	client := &http.Client{Timeout: 30 * time.Second}
	body, _ := json.Marshal(capability.InvokeRequest{Runtime: "python", Code: "print(1)"})
	for i := range cycles {
		if time.Now().After(deadline) {
			t.Fatalf("the loop ran out of time after %d of %d cycles", i, cycles)
		}
		d := start()
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for ctx.Err() == nil {
					if id := invokeOnce(ctx, client, d.url, key, body); id != "" {
						mu.Lock()
						acked = append(acked, id)
						mu.Unlock()
					}
				}
			})
		}
		time.Sleep(time.Duration(50+rand.IntN(250)) * time.Millisecond)
		d.kill()
		cancel()
		wg.Wait()
	}
	d := start()
	d.stop()

	st, err = storeopen.Open(t.Context(), storeopen.DefaultURL(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := t.Context()
	credits, err := st.GetCredits(ctx, ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	var grants, commits int64
	for cursor := ""; ; {
		page, err := st.ListLedger(ctx, ws.ID, store.PageRequest{Limit: store.MaxPageLimit, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Items {
			switch e.Kind {
			case model.LedgerGrant:
				grants += e.Amount
			case model.LedgerCommit:
				commits += e.Amount
			}
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	calls := map[string]model.ToolCall{}
	var charged int64
	var failed int
	for cursor := ""; ; {
		page, err := st.ListToolCalls(ctx, ws.ID, store.ToolCallFilter{PageRequest: store.PageRequest{Limit: store.MaxPageLimit, Cursor: cursor}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range page.Items {
			calls[c.ExecutionID] = c
			charged += c.CreditsCharged
			switch c.Status {
			case model.StatusQueued, model.StatusRunning, model.StatusAwaitingApproval:
				t.Errorf("execution %s is still %s after the last restart", c.ExecutionID, c.Status)
			case model.StatusFailed:
				failed++
			}
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	t.Logf("%d cycles: %d executions recorded, %d answered succeeded, %d failed (interrupted by a kill); %d credits charged",
		cycles, len(calls), len(acked), failed, charged)
	if credits.Reserved != 0 || grants != granted || grants-commits != credits.Available+credits.Reserved {
		t.Errorf("ledger: got granted %d, committed %d, available %d, reserved %d; want granted %d = committed + available, none reserved",
			grants, commits, credits.Available, credits.Reserved, granted)
	}
	if commits != charged {
		t.Errorf("got %d credits committed in the ledger, %d charged by the tool_calls rows; want them equal", commits, charged)
	}
	// The loop exercises what it claims: kills interrupted executions,
	// and clients were answered between them.
	if len(acked) == 0 || failed == 0 {
		t.Errorf("got %d executions answered succeeded and %d interrupted, want some of each", len(acked), failed)
	}
	for _, id := range acked {
		if c, ok := calls[id]; !ok || c.Status != model.StatusSucceeded || c.CreditsCharged <= 0 {
			t.Errorf("execution %s was answered succeeded: its row is %+v (found %v), want succeeded and charged", id, c, ok)
		}
	}
	var heads []model.ChainHead
	if h, ok, err := witness.Dir(filepath.Join(dir, "witness")).Read(ws.ID); err != nil {
		t.Fatal(err)
	} else if ok {
		heads = append(heads, h)
	}
	if ok, broken, err := st.VerifyChain(ctx, ws.ID, heads...); err != nil || !ok {
		t.Errorf("audit chain: got ok %v, broken %+v, err %v; want it to verify (witnessed heads %+v)", ok, broken, err, heads)
	}
	if len(heads) == 0 {
		t.Errorf("no witnessed head of the chain after a graceful stop")
	}
}

// invokeOnce runs one synchronous invocation and returns its execution id
// when the daemon answered that it succeeded; "" for anything else (the
// daemon killed under it, most often).
func invokeOnce(ctx context.Context, c *http.Client, base, key string, body []byte) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/executions", bytes.NewReader(body))
	if err != nil {
		return ""
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return ""
	}
	var v wire.Execution
	if json.Unmarshal(b, &v) != nil || string(v.Status) != string(model.StatusSucceeded) {
		return ""
	}
	return v.ID
}
