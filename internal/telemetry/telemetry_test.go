package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/stockade-sh/stockade/errdefs"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
	} {
		t.Run(fmt.Sprint(tc.env), func(t *testing.T) {
			if got := Enabled(env(tc.env)); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSetupRefusesWhatIsNotBuiltIn(t *testing.T) {
	for _, e := range []map[string]string{
		{"OTEL_TRACES_EXPORTER": "zipkin"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
	} {
		if _, err := Setup(t.Context(), env(e), "test"); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Setup(%v): got %v, want ErrInvalidArgument", e, err)
		}
	}
	stop, err := Setup(t.Context(), env(nil), "test")
	if err != nil || stop(t.Context()) != nil {
		t.Errorf("Setup with tracing off: %v", err)
	}
}

func TestClassOfNamesOnlyTheClass(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("the sandbox sent %q: %w", "secret-ish", errdefs.ErrInvalidArgument), "invalid_argument"},
		{errdefs.ErrGone, "gone"},
		{fmt.Errorf("x: %w", context.Canceled), "canceled"},
		{errors.New("secret-ish"), "internal"},
	} {
		if got := classOf(tc.err); got != tc.want {
			t.Errorf("classOf(%v): got %q, want %q", tc.err, got, tc.want)
		}
	}
}

// withTracing records spans (in memory, exported nowhere) until t ends.
func withTracing(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	prev := tracer.Load()
	tracer.Store(&holder{tp.Tracer(scope)})
	t.Cleanup(func() {
		tracer.Store(prev)
		_ = tp.Shutdown(context.Background())
	})
}

func TestLinks(t *testing.T) {
	withTracing(t)
	var l Links
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	ctx := WithTier(trace.ContextWithSpanContext(t.Context(), sc), "gvisor")
	l.Keep(ctx, "ex_1")
	l.Keep(t.Context(), "ex_2") // no span: nothing kept
	got := l.Context(t.Context(), "ex_1")
	if trace.SpanContextFromContext(got).TraceID() != sc.TraceID() || tierOf(got) != "gvisor" {
		t.Errorf("Context(ex_1): trace %v tier %q, want %v gvisor", trace.SpanContextFromContext(got).TraceID(), tierOf(got), sc.TraceID())
	}
	if got := l.Context(t.Context(), "ex_2"); trace.SpanContextFromContext(got).IsValid() {
		t.Error("Context(ex_2) has a span; none was kept")
	}
	l.Drop("ex_1")
	if got := l.Context(t.Context(), "ex_1"); trace.SpanContextFromContext(got).IsValid() {
		t.Error("Context(ex_1) after Drop still has its span")
	}
}

// TestLinksKeepLittle checks that Links keeps nothing with tracing off,
// and no tracestate (a client's, up to kilobytes) with tracing on.
func TestLinksKeepLittle(t *testing.T) {
	ts, err := trace.ParseTraceState("vendor=" + strings.Repeat("x", 200))
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, TraceState: ts})
	ctx := trace.ContextWithSpanContext(t.Context(), sc)
	var off Links
	off.Keep(ctx, "ex_1")
	if len(off.m) != 0 {
		t.Errorf("tracing off: %d spans kept, want none", len(off.m))
	}
	withTracing(t)
	var on Links
	on.Keep(ctx, "ex_1")
	got := trace.SpanContextFromContext(on.Context(t.Context(), "ex_1"))
	if got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || !got.IsSampled() {
		t.Errorf("tracing on: kept %v, want the trace and span of %v", got, sc)
	}
	if sc.TraceState().Len() == 0 {
		t.Fatal("the span sent has no tracestate: the check sees nothing")
	}
	if got.TraceState().Len() != 0 {
		t.Errorf("tracing on: the tracestate %q is kept", got.TraceState())
	}
}

// TestPhaseDurationWithTracingOff checks that a phase's duration is
// observed, by tier and outcome, with no tracer provider set up.
func TestPhaseDurationWithTracingOff(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collectors()...)
	count := func() uint64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["phase"] == "exec" && labels["tier"] == "container" && labels["outcome"] == "succeeded" {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
		return 0
	}
	before := count()
	_, sp := Start(WithTier(t.Context(), "container"), Exec)
	sp.EndAs("succeeded", nil)
	if after := count(); after != before+1 {
		t.Errorf("exec/container/succeeded observations: %d before, %d after, want one more", before, after)
	}
}

func TestFromMeta(t *testing.T) {
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		meta map[string]any
		want string // the trace id, "" for none
	}{
		{map[string]any{"traceparent": parent, "progressToken": 3}, "4bf92f3577b34da6a3ce929d0e0e4736"},
		{map[string]any{"traceparent": 42}, ""},
		{map[string]any{"traceparent": "00-not-a-trace"}, ""},
		{nil, ""},
	} {
		sc := trace.SpanContextFromContext(FromMeta(t.Context(), tc.meta))
		got := ""
		if sc.IsValid() {
			got = sc.TraceID().String()
		}
		if got != tc.want {
			t.Errorf("FromMeta(%v): trace %q, want %q", tc.meta, got, tc.want)
		}
	}
}

// TestLinksFull checks that Links keeps at most maxKept spans, counts the
// ones it refuses and says it is full once.
func TestLinksFull(t *testing.T) {
	withTracing(t)
	fulls := 0
	l := Links{Full: func() { fulls++ }}
	ctx := trace.ContextWithSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}}))
	for i := range maxKept + 2 {
		l.Keep(ctx, fmt.Sprint("ex_", i))
	}
	if l.Len() != maxKept || l.Refused() != 2 || fulls != 1 {
		t.Errorf("kept %d, refused %d, said full %d times; want %d, 2, once", l.Len(), l.Refused(), fulls, maxKept)
	}
}

func TestEndpointHidesCredentials(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "http://localhost:4318"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://alice:s3cret@collector:4318/otlp?token=s3cret#s3cret"}, "https://collector:4318/otlp"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://bob@b:4318/v1/traces"}, "http://b:4318/v1/traces"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "alice:s3cret@collector"}, "(not a URL)"},
	} {
		if got := Endpoint(env(tc.env)); got != tc.want {
			t.Errorf("Endpoint(%v): got %q, want %q", tc.env, got, tc.want)
		}
	}
}
