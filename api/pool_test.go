package api_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestPoolMetrics runs a one-shot from a warm pool through the API and
// reads the pool's series in /metrics.
func TestPoolMetrics(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 10, policy: noApproval, startPools: true,
			engine: []engine.Option{engine.WithPools(engine.PoolOptions{Pools: []engine.PoolSpec{{Runtime: "python", Size: 1}}})}})
		e.waitMetric(`stockade_pool_sandboxes{pool="code.execute/python"} 1`)
		e.wantMetrics("of a filled pool", `stockade_pool_hits_total{pool="code.execute/python"}`, `stockade_pool_refill_seconds_count{pool="code.execute/python"} 1`,
			`stockade_pool_target_sandboxes{pool="code.execute/python"} 1`, `stockade_pool_refill_cpu_seconds_count{from="cold",pool="code.execute/python"} 1`)
		ex := e.invoke(capability.InvokeRequest{Runtime: "python", Code: "import sys; print('pandas' in sys.modules)"}).want(t, http.StatusOK).execution(t)
		var res engine.Result
		if err := json.Unmarshal(ex.Result.JSON(), &res); err != nil || res.Stdout != "True\n" {
			t.Errorf("got result %s, want pandas imported already (a pooled run)", ex.Result)
		}
		// A request the pool cannot serve (a looser limit is impossible
		// over the API; the shell runtime has no pool) is neither.
		e.invoke(capability.InvokeRequest{Runtime: "shell", Code: "echo hi"}).want(t, http.StatusOK)
		e.wantMetrics("after a pooled run", `stockade_pool_hits_total{pool="code.execute/python"} 1`)
		e.waitMetric(`stockade_pool_refill_seconds_count{pool="code.execute/python"} 2`)
	})
}

// TestMemoryBudgetRefuses checks that an invocation whose sandbox would
// take the sandboxes' memory past the budget is refused with 429 and
// Retry-After, and recorded as a denial.
func TestMemoryBudgetRefuses(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		mem := sandbox.DefaultLimits().Memory
		e := newEnv(t, b, envConfig{credits: 10, policy: noApproval, engine: []engine.Option{engine.WithMemoryBudget(mem)}})
		long := make(chan answer, 1)
		go func() {
			long <- invokeConcurrently(e.url, e.agent, 1, capability.InvokeRequest{Runtime: "shell", Code: "sleep 2; echo done"})[0]
		}()
		e.waitToolCalls("status=running", 1)
		r := e.invoke(capability.InvokeRequest{Runtime: "shell", Code: "echo refused"})
		r.wantError(t, http.StatusTooManyRequests, "resource_exhausted", "memory_budget")
		if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
			t.Errorf("Retry-After: got %q, want a number of seconds", r.header.Get("Retry-After"))
		}
		if a := <-long; a.err != nil || a.code != http.StatusOK {
			t.Fatalf("the running execution: got %d %v %s", a.code, a.err, a.body)
		}
		denied := e.events("capability.invoke_denied", "")
		if len(denied) != 1 || decisionOf(t, denied[0]) != "memory_exhausted" {
			t.Errorf("invoke_denied events: got %+v, want one memory_exhausted", denied)
		}
		// Once the run has ended its memory is free again.
		e.invoke(capability.InvokeRequest{Runtime: "shell", Code: "echo again"}).want(t, http.StatusOK)
	})
}

// waitMetric waits until /metrics has line.
func (e *env) waitMetric(line string) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(e.metrics(), line) {
		if time.Now().After(deadline) {
			e.t.Fatalf("/metrics has no %q after 60s; got\n%s", line, grepLines(e.metrics(), "stockade_pool"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMemoryBudgetConcurrent checks that invocations admitted at once
// reserve their memory as they are admitted: with room for two sandboxes,
// of six at once two run and four are refused up front with 429 and
// Retry-After, none admitted to fail later, and the memory is all free
// again once the two have ended.
func TestMemoryBudgetConcurrent(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		mem := sandbox.DefaultLimits().Memory
		e := newEnv(t, b, envConfig{credits: 40, policy: noApproval, svc: capability.ServiceOptions{MaxConcurrent: 8},
			engine: []engine.Option{engine.WithMemoryBudget(2 * mem)}})
		req := capability.InvokeRequest{Runtime: "shell", Code: "sleep 2; echo done"}
		ran, refused := 0, 0
		for _, a := range invokeConcurrently(e.url, e.agent, 6, req) {
			var ex struct {
				Status string `json:"status"`
			}
			switch {
			case a.err != nil:
				t.Fatal(a.err)
			case a.code == http.StatusOK && json.Unmarshal(a.body, &ex) == nil && ex.Status == "succeeded":
				ran++
			case a.code == http.StatusTooManyRequests && strings.Contains(string(a.body), "memory_budget") && a.retryAfter != "":
				refused++
			default:
				t.Errorf("got %d %s (Retry-After %q), want 200 succeeded or 429 memory_budget", a.code, a.body, a.retryAfter)
			}
		}
		if ran != 2 || refused != 4 {
			t.Errorf("got %d run and %d refused, want 2 and 4", ran, refused)
		}
		// All of the budget is free again: two fit at once.
		for _, a := range invokeConcurrently(e.url, e.agent, 2, capability.InvokeRequest{Runtime: "shell", Code: "echo again"}) {
			if a.err != nil || a.code != http.StatusOK {
				t.Errorf("after the burst: got %d %v %s, want 200", a.code, a.err, a.body)
			}
		}
	})
}
