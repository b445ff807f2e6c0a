package capability

import (
	"context"
	"testing"
	"time"

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
