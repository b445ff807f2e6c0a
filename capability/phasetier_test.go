package capability

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
)

// phaseCounts is the stockade_phase_duration_seconds observations by
// phase and tier.
func phaseCounts(t *testing.T, reg *prometheus.Registry) map[[2]string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[[2]string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "stockade_phase_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[[2]string{l["phase"], l["tier"]}] += m.GetHistogram().GetSampleCount()
		}
	}
	return out
}

// TestPhaseTierWithTracingOff checks that with tracing off (the default)
// every phase of an invocation after its admission is labelled with its
// driver's tier: the approval wait, the queue, the sandbox's creation, the
// exec, its destruction and its egress decisions (and those of a
// session's sandbox). Their tier must not
// depend on the invocation's span being kept (telemetry.Links keeps
// nothing with tracing off).
func TestPhaseTierWithTracingOff(t *testing.T) {
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	reg.MustRegister(telemetry.Collectors()...)
	hold := make(chan struct{})
	env := newServiceEnv(t, nil, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Hold: hold}, model.DefaultPolicy(), ServiceOptions{})
	before := phaseCounts(t, reg)
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Approval == nil {
		t.Fatal("the invocation waits for no approval: the approval wait is not seen")
	}
	if _, _, err := env.svc.Decide(ctx, env.key(t, model.RoleApprover, "approver"), inv.Approval.ID, true, "ok"); err != nil {
		t.Fatal(err)
	}
	for {
		e, err := env.st.GetExecution(ctx, env.ws.ID, inv.Execution.ID)
		if err != nil {
			t.Fatal(err)
		}
		if e.Status == model.StatusRunning {
			break
		}
		if e.Status.Terminal() {
			t.Fatalf("the execution ended %s before it was seen running", e.Status)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A decision of its sandbox's egress proxy, as the engine reports it.
	env.svc.egress.egressDecision(engine.EgressDecision{Decision: egress.Decision{Allowed: true, Time: time.Now()},
		Labels: map[string]string{engine.LabelExecution: inv.Execution.ID}})
	// And one of a session's sandbox (no execution of its own): its tier
	// is its tool's.
	env.svc.egress.egressDecision(engine.EgressDecision{Decision: egress.Decision{Allowed: true, Time: time.Now()},
		Labels: map[string]string{engine.LabelSession: "ses_tier", engine.LabelWorkspace: env.ws.ID}})
	close(hold)
	if e, err := env.svc.Wait(ctx, env.agent, inv.Execution.ID, 30*time.Second); err != nil || !e.Status.Terminal() {
		t.Fatalf("waiting for the execution: %s, %v", e.Status, err)
	}
	after := phaseCounts(t, reg)
	for _, phase := range []string{"approval.wait", "queue", "sandbox.create", "exec", "sandbox.destroy", "egress.decision"} {
		if n := after[[2]string{phase, ""}] - before[[2]string{phase, ""}]; n != 0 {
			t.Errorf("phase %s: %d observations without a tier", phase, n)
		}
		if n := after[[2]string{phase, "gvisor"}] - before[[2]string{phase, "gvisor"}]; n == 0 {
			t.Errorf("phase %s: no observation of tier gvisor", phase)
		}
	}
}
