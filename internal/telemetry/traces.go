package telemetry

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/trace"
)

// maxKept bounds the invocations whose trace a Links keeps: past it a new
// invocation's later phases start traces of their own rather than grow
// the daemon's memory without bound.
const maxKept = 100_000

// Links keeps the span of each invocation (by execution id) from its
// admission until its run ends, so that the phases that happen later, in
// other requests or goroutines (the approval wait, the queue, the
// sandbox, egress and broker decisions), join the invocation's trace.
// The zero Links is ready; it is safe for concurrent use. With tracing
// off it keeps nothing (an invocation's span context may still be valid
// then: the client's traceparent). It keeps a span's trace id, span id
// and flags, never the tracestate, which a client sends before it is
// authenticated and which may be kilobytes. The tier of an invocation's
// phases does not depend on it: the callers set it (WithTier).
type Links struct {
	// Full, when set, is called once, the first time Keep finds maxKept
	// spans kept already: for the daemon's log.
	Full func()

	mu      sync.Mutex
	m       map[string]link
	refused uint64 // Keeps refused for want of room
}

type link struct {
	sc   trace.SpanContext
	tier string
}

// Keep remembers ctx's span (and tier) as execution id's, when tracing
// is on; it reports whether it did. Whoever learns that the execution's
// run ended, or never will, must Drop it.
func (l *Links) Keep(ctx context.Context, id string) (kept bool) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || id == "" || !tracing() {
		return false
	}
	// Not the tracestate: the span's own, or the client's it carries on.
	sc = trace.NewSpanContext(trace.SpanContextConfig{TraceID: sc.TraceID(), SpanID: sc.SpanID(), TraceFlags: sc.TraceFlags()})
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[string]link)
	}
	if len(l.m) >= maxKept {
		if l.refused++; l.refused == 1 && l.Full != nil {
			l.Full()
		}
		return false
	}
	l.m[id] = link{sc: sc, tier: tierOf(ctx)}
	return true
}

// Refused is how many executions Keep found no room for (maxKept): their
// later phases start traces of their own.
func (l *Links) Refused() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refused
}

// Len is how many executions' spans are kept.
func (l *Links) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

// Context is ctx under execution id's span and with its tier, or ctx
// itself when none is kept.
func (l *Links) Context(ctx context.Context, id string) context.Context {
	l.mu.Lock()
	k, ok := l.m[id]
	l.mu.Unlock()
	if !ok {
		return ctx
	}
	return WithTier(trace.ContextWithSpanContext(ctx, k.sc), k.tier)
}

// Drop forgets execution id's span: its run has ended, or it never will.
func (l *Links) Drop(id string) {
	l.mu.Lock()
	delete(l.m, id)
	l.mu.Unlock()
}
