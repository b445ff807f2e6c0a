package api_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/wire"
)

// The sandbox networks of the telemetry test: a prefix and range of their
// own, apart from the other tests'.
const otelPrefix = "stko"

var otelRange = netip.MustParsePrefix("10.213.176.0/20")

// otlpSinkEnv names the OTLP receiver binary (scripts/otlpsink.sh prints
// its path); unset, the test runs that script, which builds it once.
const otlpSinkEnv = "STOCKADE_TEST_OTLPSINK"

// tracedCode is the sandbox's program, as tracedCode % (port, mark): it
// fetches the allowed upstream, tries a name the tool may not reach (a
// refusal of the proxy), calls the broker's echo operation, and prints a
// line made of mark that the code itself does not hold.
const tracedCode = `
import urllib.request
port, mark = %d, %q
for label, url in [("allowed", "http://allowed.test:%%d/x" %% port), ("other", "http://other.test:%%d/x" %% port),
                   ("broker", "http://broker.stockade.internal/v1/ops/echo?msg=hi")]:
    try:
        print(label, urllib.request.urlopen(url, timeout=5).status)
    except Exception as e:
        print(label, "FAILED", type(e).__name__)
print("out" + "put-" + mark)
`

// TestTraceOfApprovedInvocation sends one approval-gated invocation with a
// traceparent to a daemon whose traces go to a real OTLP receiver (the
// OpenTelemetry Collector's otlpreceiver, scripts/otlpsink), approves it,
// and checks that the receiver got a span of every phase in the trace the
// client started, under the client's span, and that no span attribute
// holds the code, its output or the broker's secret.
func TestTraceOfApprovedInvocation(t *testing.T) {
	requireSandboxes(t)
	spans, flush := traceTo(t)

	mark := rand.Text()
	secret := "stk-secret-" + rand.Text()
	e := newTracedEnv(t, secret)
	code := fmt.Sprintf(tracedCode, e.port, mark)

	// The client's own span: the trace the invocation must join.
	traceID, parentID, traceparent := newTraceparent()
	r := e.invoke(capability.InvokeRequest{Runtime: "python", Tool: "traced", Network: "allow", Code: code},
		"traceparent", traceparent).want(t, http.StatusAccepted)
	v := r.execution(t)
	if v.ApprovalID == "" {
		t.Fatalf("the invocation did not wait for approval: %s", r.body)
	}
	time.Sleep(50 * time.Millisecond) // an approval wait a span can show
	e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, map[string]string{"reason": "traced"}).want(t, http.StatusOK)
	got := e.wait(v.ID, 50*time.Second)
	res := result(t, got)
	if string(got.Status) != string(model.StatusSucceeded) || !strings.Contains(res.Stdout, "output-"+mark) ||
		!strings.Contains(res.Stdout, "allowed 200") || !strings.Contains(res.Stdout, "broker 200") {
		t.Fatalf("the run: status %s, stdout %q, stderr %q", got.Status, res.Stdout, res.Stderr)
	}

	// First show that the check sees a planted string: a span of another
	// trace, through the same exporter and receiver, with each of them in
	// an attribute.
	_, planted := telemetry.ServerSpan(t.Context(), "planted", attribute.String("a", code),
		attribute.String("b", "output-"+mark), attribute.String("c", secret))
	planted.End()
	plantedTrace := planted.SpanContext().TraceID().String()
	flush()

	all := spans.read(t)
	forbidden := []string{code, "output-" + mark, mark, secret, "stk-secret-"}
	if leaks := leaksOf(spansOf(all, plantedTrace), forbidden); len(leaks) != 3 {
		t.Fatalf("the check found %d of the 3 planted strings: %v", len(leaks), leaks)
	}

	ours := spansOf(all, traceID)
	byName := map[string][]otlpSpan{}
	for _, s := range ours {
		byName[s.Name] = append(byName[s.Name], s)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range byName {
			if !yield(n) {
				return
			}
		}
	})
	t.Logf("%d spans in trace %s: %v", len(ours), traceID, names)
	for _, p := range []telemetry.Phase{telemetry.Authenticate, telemetry.Policy, telemetry.Invoke, telemetry.ApprovalWait,
		telemetry.Queue, telemetry.SandboxCreate, telemetry.Exec, telemetry.SandboxDestroy, telemetry.StoreWrite,
		telemetry.EgressDecision, telemetry.BrokerCall} {
		if len(byName[string(p)]) == 0 {
			t.Errorf("no %s span in the invocation's trace", p)
		}
	}
	post := byName["POST /v1/executions"]
	if len(post) != 1 || post[0].ParentSpanID != parentID {
		t.Errorf("POST /v1/executions spans: got %+v, want one under the client's span %s", post, parentID)
	}
	for _, s := range byName[string(telemetry.Invoke)] {
		if s.attr("gen_ai.tool.name") != "traced" || s.attr("stockade.tier") != "container" || s.attr("stockade.workspace.id") != e.ws.ID ||
			s.attr("gen_ai.tool.call.id") != v.ID || s.attr("stockade.outcome") != "ok" {
			t.Errorf("invoke span attributes: %v", s.Attributes)
		}
	}
	if w := byName[string(telemetry.ApprovalWait)]; len(w) != 1 || w[0].attr("stockade.outcome") != "approved" {
		t.Errorf("approval wait spans: %+v, want one approved", w)
	}
	outcomes := map[string]bool{}
	for _, s := range byName[string(telemetry.EgressDecision)] {
		outcomes[s.attr("stockade.outcome")] = true
	}
	if !outcomes["allowed"] || !outcomes["refused"] {
		t.Errorf("egress decision outcomes: %v, want allowed and refused", outcomes)
	}
	if leaks := leaksOf(ours, forbidden); len(leaks) > 0 {
		t.Errorf("span attributes hold the code, its output or the secret: %v", leaks)
	}
}

// TestTraceOfSessionCell checks that a session's cell, sent with a
// traceparent, is traced in the client's trace up to its exec in the
// session's kernel.
func TestTraceOfSessionCell(t *testing.T) {
	requireSandboxes(t)
	spans, flush := traceTo(t)
	e := newEnv(t, backends[0], envConfig{sessions: true, policy: noApproval, credits: 10})
	openID, _, openParent := newTraceparent()
	var ss wire.Session
	e.do("POST", "/v1/sessions", e.agent, capability.CreateSessionRequest{Runtime: "python"}, "traceparent", openParent).
		want(t, http.StatusCreated).decode(t, &ss)
	t.Cleanup(func() { do(t, e.url, "DELETE", "/v1/sessions/"+ss.ID, e.admin, nil) })
	traceID, _, traceparent := newTraceparent()
	if c := e.cell(e.agent, ss.ID, "print traced", "traceparent", traceparent); c.Stdout != "traced\n" {
		t.Fatalf("the cell printed %q", c.Stdout)
	}
	flush()
	names := map[string]string{}
	for _, s := range spansOf(spans.read(t), traceID) {
		names[s.Name] = s.attr("stockade.outcome")
	}
	for _, p := range []telemetry.Phase{telemetry.Authenticate, telemetry.Policy, telemetry.StoreWrite, telemetry.Exec} {
		if _, ok := names[string(p)]; !ok {
			t.Errorf("no %s span in the cell's trace: %v", p, names)
		}
	}
	if got := names[string(telemetry.Exec)]; got != "succeeded" {
		t.Errorf("the cell's exec span: outcome %q, want succeeded", got)
	}
	opened := map[string]string{}
	for _, s := range spansOf(spans.read(t), openID) {
		opened[s.Name] = s.attr("stockade.outcome")
	}
	if opened[string(telemetry.SandboxCreate)] != "ok" || opened[string(telemetry.Policy)] == "" {
		t.Errorf("the session's opening: spans %v, want policy and sandbox.create ok", opened)
	}
}

// traceTo sets up the daemon's tracing, sampler always on, to a receiver
// of its own (otlpSink) until the test ends; flush sends what is buffered
// and ends the tracing.
func traceTo(t *testing.T) (spans sinkSpans, flush func()) {
	t.Helper()
	spans = startSink(t, otlpSink(t))
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", spans.url)
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	stop, err := telemetry.Setup(t.Context(), os.Getenv, "test")
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	flush = func() {
		if !stopped {
			stopped = true
			if err := stop(context.WithoutCancel(t.Context())); err != nil {
				t.Errorf("flushing the spans: %v", err)
			}
		}
	}
	t.Cleanup(flush)
	return spans, flush
}

// newTraceparent is a fresh client span: its trace id, span id and W3C
// traceparent header (sampled).
func newTraceparent() (traceID, spanID, header string) {
	var tid [16]byte
	var sid [8]byte
	_, _ = rand.Read(tid[:])
	_, _ = rand.Read(sid[:])
	traceID, spanID = hex.EncodeToString(tid[:]), hex.EncodeToString(sid[:])
	return traceID, spanID, "00-" + traceID + "-" + spanID + "-01"
}

// otlpSink returns the receiver's binary: $STOCKADE_TEST_OTLPSINK, or the
// one scripts/otlpsink.sh builds (once per version, outside the checkout).
func otlpSink(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(otlpSinkEnv); p != "" {
		return p
	}
	testenv.RequiresBinary(t, "go")
	out, err := exec.CommandContext(t.Context(), filepath.Join(testenv.ModuleRoot(), "scripts", "otlpsink.sh")).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		testenv.Missing(t, fmt.Sprintf("building the OTLP receiver (scripts/otlpsink.sh): %v\n%s", err, stderr))
	}
	return strings.TrimSpace(string(out))
}

// sinkSpans is a running receiver: its OTLP/HTTP URL and the file it
// writes.
type sinkSpans struct {
	url  string
	file string
}

// startSink runs the receiver bin on a free loopback port until the test
// ends.
func startSink(t *testing.T, bin string) sinkSpans {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	file := filepath.Join(t.TempDir(), "spans.jsonl")
	cmd := exec.Command(bin, "-listen", addr, "-out", file)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ready <- sc.Scan() && strings.HasPrefix(sc.Text(), "ready")
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("the OTLP receiver did not start")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the OTLP receiver did not start in 30 s")
	}
	return sinkSpans{url: "http://" + addr, file: file}
}

// otlpSpan is what the test reads of a span in OTLP JSON.
type otlpSpan struct {
	TraceID      string `json:"traceId"`
	SpanID       string `json:"spanId"`
	ParentSpanID string `json:"parentSpanId"`
	Name         string `json:"name"`
	Attributes   []struct {
		Key   string `json:"key"`
		Value struct {
			String *string `json:"stringValue"`
			Int    *string `json:"intValue"`
		} `json:"value"`
	} `json:"attributes"`
}

// attr is the span's attribute key, as a string ("" when absent).
func (s otlpSpan) attr(key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			switch {
			case a.Value.String != nil:
				return *a.Value.String
			case a.Value.Int != nil:
				return *a.Value.Int
			}
		}
	}
	return ""
}

// read returns every span the receiver wrote.
func (s sinkSpans) read(t *testing.T) []otlpSpan {
	t.Helper()
	b, err := os.ReadFile(s.file)
	if err != nil {
		t.Fatal(err)
	}
	var spans []otlpSpan
	for line := range strings.Lines(string(b)) {
		var batch struct {
			ResourceSpans []struct {
				ScopeSpans []struct {
					Spans []otlpSpan `json:"spans"`
				} `json:"scopeSpans"`
			} `json:"resourceSpans"`
		}
		if err := json.Unmarshal([]byte(line), &batch); err != nil {
			t.Fatalf("the receiver's line %q: %v", line, err)
		}
		for _, rs := range batch.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				spans = append(spans, ss.Spans...)
			}
		}
	}
	return spans
}

// spansOf are the spans of trace id (hex).
func spansOf(all []otlpSpan, id string) []otlpSpan {
	var out []otlpSpan
	for _, s := range all {
		if strings.EqualFold(s.TraceID, id) {
			out = append(out, s)
		}
	}
	return out
}

// leaksOf lists the span attributes that hold one of forbidden, a string
// that must not leave the daemon in a trace.
func leaksOf(spans []otlpSpan, forbidden []string) []string {
	var leaks []string
	for _, s := range spans {
		for _, a := range s.Attributes {
			if a.Value.String == nil {
				continue
			}
			for _, f := range forbidden {
				if strings.Contains(*a.Value.String, f) {
					leaks = append(leaks, fmt.Sprintf("%s: %s holds %.20q", s.Name, a.Key, f))
					break
				}
			}
		}
	}
	return leaks
}

// tracedEnv is an env whose tool "traced" may reach an upstream on
// loopback by the name allowed.test and call the broker's echo operation,
// whose credential is secret; the workspace's policy needs approval.
type tracedEnv struct {
	*env
	port int
}

func newTracedEnv(t *testing.T, secret string) *tracedEnv {
	t.Helper()
	es := newEgressSetup(t, otelPrefix, otelRange, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "upstream")
	}, func(port int) string {
		return fmt.Sprintf(`
tools:
  - name: traced
    input_trust: trusted
    tier: container
    runtimes: [python]
    credentials: [echo]
    egress:
      allow: [%s]
      ports: [%d]
`, allowedName, port)
	}, func(url string) *broker.Config {
		return &broker.Config{
			Operations: []broker.Operation{{Name: "echo", Method: http.MethodGet, URL: url + "/echo",
				Params: []broker.Param{{Name: "msg"}}, Credential: broker.Credential{Env: "ECHO_TOKEN"}, Prefix: "Bearer "}},
			LookupEnv: func(name string) (string, bool) { return secret, name == "ECHO_TOKEN" },
		}
	})
	set, topts, host, port := es.set, es.topts, es.host, es.port
	e := newEnv(t, backends[0], envConfig{
		credits: 10,
		policy: func(p *model.Policy) {
			p.Approval = model.ApprovalRequired
			p.NetworkAllowed = true
		},
		engine: []engine.Option{engine.WithTools(set, topts), engine.WithEgress(host)},
	})
	return &tracedEnv{env: e, port: port}
}
