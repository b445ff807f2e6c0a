package capability

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/sandbox"
)

// tracingOn records spans until t ends, exported to a port where nothing
// listens.
func tracingOn(t *testing.T) {
	t.Helper()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
	getenv := func(k string) string {
		return map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}[k]
	}
	stop, err := telemetry.Setup(t.Context(), getenv, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = stop(ctx) // nothing listens: the spans are not sent
	})
}

// TestLinksDroppedWhenTheEndIsNotRecorded checks that an execution's span
// is no longer kept once its run is over, even when recording its end
// failed every attempt: Links would otherwise grow with each such run.
func TestLinksDroppedWhenTheEndIsNotRecorded(t *testing.T) {
	tracingOn(t)
	saved := storeRetries
	storeRetries = []time.Duration{time.Millisecond}
	t.Cleanup(func() { storeRetries = saved })
	st := &flakyEnds{testStore: openSQLite(t)}
	st.n.Store(1 << 20)
	env := newServiceEnv(t, st, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, noApprovalPolicy(), ServiceOptions{})
	if _, err := env.svc.Invoke(t.Context(), env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{}); err != nil {
		t.Fatal(err)
	}
	// The run's goroutine has ended once it is no longer live.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		env.svc.runs.liveMu.Lock()
		n := len(env.svc.runs.live)
		env.svc.runs.liveMu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the run is still live after a minute")
		}
	}
	if n := env.svc.traces.Len(); n != 0 {
		t.Errorf("%d executions' spans still kept after their runs ended", n)
	}
}

// TestDecisionSpansCapped checks that the egress and broker decisions of
// one execution, and of one session's sandbox, get at most
// maxDecisionSpans spans: a sandbox decides how many it makes.
func TestDecisionSpansCapped(t *testing.T) {
	tracingOn(t)
	env := newServiceEnv(t, nil, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, noApprovalPolicy(), ServiceOptions{})
	ctx, sp := telemetry.Start(t.Context(), telemetry.Invoke)
	defer sp.End(nil)
	const exec = "ex_capped"
	if !env.svc.traces.Keep(ctx, exec) {
		t.Fatal("the execution's span is not kept: no decision can have a span")
	}
	env.svc.egress.startRun(exec, env.ws.ID, "gvisor")
	defer env.svc.egress.endRun(exec)
	for _, labels := range []map[string]string{
		{engine.LabelExecution: exec},
		{engine.LabelSession: "ses_capped", engine.LabelWorkspace: env.ws.ID},
	} {
		spans := 0
		for range 3 * maxDecisionSpans {
			if trace.SpanContextFromContext(env.svc.egress.phaseContext(labels, "")).IsValid() {
				spans++
			}
		}
		// A session's sandbox between cells has no execution, so none of its
		// decisions is under a span; the count must still stop.
		want := maxDecisionSpans
		if labels[engine.LabelExecution] == "" {
			want = 0
		}
		if spans != want {
			t.Errorf("%v: %d of %d decisions under a span, want %d", labels, spans, 3*maxDecisionSpans, want)
		}
	}
	env.svc.egress.runsMu.Lock()
	n := env.svc.egress.spans["ses_capped"]
	env.svc.egress.runsMu.Unlock()
	if n != 3*maxDecisionSpans {
		t.Errorf("the session's decisions counted: %d, want %d", n, 3*maxDecisionSpans)
	}
}
