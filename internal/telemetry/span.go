package telemetry

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Phase names a phase of an invocation: its span's name and the phase
// label of its duration's histogram.
type Phase string

// The phases. Invoke is the invocation's own span, the parent of the rest
// (they may end after it: the approval wait, the run).
const (
	Invoke         Phase = "stockade.invoke"
	Authenticate   Phase = "stockade.authenticate"
	Policy         Phase = "stockade.policy"
	ApprovalWait   Phase = "stockade.approval.wait"
	Queue          Phase = "stockade.queue"
	PoolAcquire    Phase = "stockade.pool.acquire"
	SandboxCreate  Phase = "stockade.sandbox.create"
	Exec           Phase = "stockade.exec"
	SandboxDestroy Phase = "stockade.sandbox.destroy"
	StoreWrite     Phase = "stockade.store.write"
	EgressDecision Phase = "stockade.egress.decision"
	BrokerCall     Phase = "stockade.broker.call"
)

// Outcomes a span ends with besides a specific one (approved, hit, ...).
const (
	OutcomeOK    = "ok"
	OutcomeError = "error"
)

// tracer is the tracer of every span: off (no-op) unless Setup set one
// up.
var tracer atomic.Pointer[holder]

// off is the no-op tracer.
var off = &holder{noop.NewTracerProvider().Tracer(scope)}

func init() { tracer.Store(off) }

// tracing reports whether spans are recorded: Setup set tracing up (and
// SetTracing did not turn it off).
func tracing() bool { return tracer.Load() != off }

// Span is one phase's span and the start of its duration. The zero Span
// is inert. End it once (defer sp.End(&err) sees a later SetTier: its
// methods take a pointer).
type Span struct {
	s     trace.Span
	phase Phase
	tier  string
	start time.Time
}

// Start begins phase's span, a child of ctx's span, with attrs (attrs.go's
// constructors) and the tier ctx carries (WithTier). With tracing off the
// span records nothing, but End still observes the phase's duration.
func Start(ctx context.Context, phase Phase, attrs ...attribute.KeyValue) (context.Context, Span) {
	tier := tierOf(ctx)
	if tier != "" {
		attrs = append(attrs, Tier(tier))
	}
	ctx, s := tracer.Load().Start(ctx, string(phase), trace.WithAttributes(attrs...))
	return ctx, Span{s: s, phase: phase, tier: tier, start: time.Now()}
}

// Set adds attributes to the span.
func (s *Span) Set(attrs ...attribute.KeyValue) {
	if s.s != nil {
		s.s.SetAttributes(attrs...)
	}
}

// SetTier sets the span's tier, once it is known: its attribute and the
// label of its duration.
func (s *Span) SetTier(tier string) {
	if s.s == nil || tier == "" {
		return
	}
	s.tier = tier
	s.s.SetAttributes(Tier(tier))
}

// End ends the span with outcome ok, or error with *errp's class (a nil
// errp or *errp is ok).
func (s *Span) End(errp *error) {
	var err error
	if errp != nil {
		err = *errp
	}
	outcome := OutcomeOK
	if err != nil {
		outcome = OutcomeError
	}
	s.EndAs(outcome, err)
}

// EndAs ends the span with outcome and err (nil for none): its status, its
// outcome attribute and the phase's histogram. Only err's class is
// recorded (error.type), never its message, which may quote what a
// sandbox sent.
func (s *Span) EndAs(outcome string, err error) {
	if s.s == nil {
		return
	}
	observe(s.phase, s.tier, outcome, time.Since(s.start))
	if !s.s.IsRecording() {
		s.s.End()
		return
	}
	s.s.SetAttributes(Outcome(outcome))
	if err != nil {
		s.s.SetAttributes(ErrorType(err))
		s.s.SetStatus(codes.Error, classOf(err))
	}
	s.s.End()
}

// Record adds a span of phase that already happened, from start for d,
// under parent (ContextOf), and observes its duration: the approval wait,
// known when it is decided, and the egress proxy's and the broker's
// decisions, reported once made.
func Record(parent context.Context, phase Phase, start time.Time, d time.Duration, outcome string, attrs ...attribute.KeyValue) {
	tier := tierOf(parent)
	observe(phase, tier, outcome, d)
	if !trace.SpanContextFromContext(parent).IsValid() {
		return
	}
	if tier != "" {
		attrs = append(attrs, Tier(tier))
	}
	attrs = append(attrs, Outcome(outcome))
	_, s := tracer.Load().Start(parent, string(phase), trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	s.End(trace.WithTimestamp(start.Add(d)))
}

// Unlinked is ctx under no span, with its tier: Record under it measures
// a phase and adds no span.
func Unlinked(ctx context.Context) context.Context {
	return trace.ContextWithSpanContext(ctx, trace.SpanContext{})
}

type tierKey struct{}

// WithTier makes the spans and durations started under ctx carry tier.
func WithTier(ctx context.Context, tier string) context.Context {
	if tier == "" {
		return ctx
	}
	return context.WithValue(ctx, tierKey{}, tier)
}

// TierOf is the tier ctx carries (WithTier), or "".
func TierOf(ctx context.Context) string { return tierOf(ctx) }

func tierOf(ctx context.Context) string {
	t, _ := ctx.Value(tierKey{}).(string)
	return t
}

// ServerSpan begins the span of an API request, named name (its method
// and route), a child of the client's trace context in ctx, if any.
func ServerSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return tracer.Load().Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// EndServerSpan ends an API request's span, an error for a 5xx status.
func EndServerSpan(s trace.Span, status int) {
	if status >= 500 {
		s.SetStatus(codes.Error, "")
	}
	s.End()
}
