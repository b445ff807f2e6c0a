package api

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/stockade-sh/stockade/internal/telemetry"
)

// observe gives every request its server span, a child of the client's
// traceparent when it sent one, named by its route ("POST
// /v1/executions"), and logs one line when the answer has been written:
// the request id, method, route, status, bytes and duration, the trace id
// when there is one, and the cause of an answer that is a 5xx or hides an
// error's message (Report: its code and err; the line is then "request
// failed"). The line is Info, Warn for a
// 4xx that is not a 404 and Error for a 5xx. mux finds the route, as it
// will when serving.
func (s *server) observe(mux *http.ServeMux, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		// The route is mux's pattern, "METHOD /path/{id}" (or "/ui/"):
		// the span's name, and its path the http.route attribute.
		_, route := mux.Handler(r)
		path := route[strings.IndexByte(route, ' ')+1:]
		method := knownMethod(r.Method)
		name := route
		if path == "/" || path == "" {
			path, name = "", method
		} else if name == path {
			name = method + " " + path
		}
		rl := &requestLog{}
		ctx := context.WithValue(r.Context(), requestLogKey{}, rl)
		ctx = telemetry.FromHeader(ctx, r.Header)
		ctx, span := telemetry.ServerSpan(ctx, name,
			attribute.String("http.request.method", method), attribute.String("http.route", path))
		rw := &statusWriter{ResponseWriter: w}
		// Deferred: a handler that panics (net/http recovers it) still
		// ends its span and logs its line, as a 500.
		returned := false
		defer func() {
			if !returned {
				rw.status = http.StatusInternalServerError
			}
			s.logRequest(ctx, span, rw, method, name, start)
		}()
		next.ServeHTTP(rw, r.WithContext(ctx))
		returned = true
	})
}

// logRequest ends a request's span and logs its line (see observe).
func (s *server) logRequest(ctx context.Context, span trace.Span, rw *statusWriter, method, name string, start time.Time) {
	rl := requestLogOf(ctx)
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	span.SetAttributes(attribute.Int("http.response.status_code", rw.status))
	telemetry.EndServerSpan(span, rw.status)
	// From here on a Report under ctx (a goroutine the request
	// started, still going) logs a line of its own.
	cause, code, rlStatus := rl.finish()
	// An MCP call's error is answered in a 200: the level is the
	// error's too.
	status := max(rw.status, rlStatus)
	level := slog.LevelInfo
	switch {
	case status >= 500:
		level = slog.LevelError
	case status >= 400 && status != http.StatusNotFound:
		level = slog.LevelWarn
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("request_id", RequestID(ctx)), slog.String("method", method),
		slog.String("route", name), slog.Int("status", rw.status), slog.Int64("bytes", rw.bytes),
		slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000)}
	msg := "request"
	if cause != nil {
		msg = "request failed"
		attrs = append(attrs, slog.String("code", code), slog.String("err", cause.Error()))
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
	}
	s.log.LogAttrs(ctx, level, msg, attrs...)
}

// knownMethod is m when it is one of HTTP's methods (RFC 9110, and PATCH),
// else "_OTHER", as the OpenTelemetry HTTP conventions name it: a
// client's made-up method names no span, route or log line.
func knownMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
		http.MethodConnect, http.MethodOptions, http.MethodTrace, http.MethodPatch:
		return m
	}
	return "_OTHER"
}

// statusWriter notes the status and the bytes of an answer. It unwraps for
// http.ResponseController and flushes for event streams.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// requestLog is what Report leaves for the request's line: the cause of
// an answer that hid it. It is safe for concurrent use: a Report may come
// from a goroutine of the request's while observe logs its line.
type requestLog struct {
	mu     sync.Mutex
	done   bool // the request's line is being written: too late to add to it
	cause  error
	code   string
	status int
}

// note leaves err (answered with code and status) for the request's line;
// it reports false when the line can take no cause (it is written, or it
// holds one already): the caller logs err itself.
func (rl *requestLog) note(err error, code string, status int) bool {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.done || rl.cause != nil {
		return false
	}
	rl.cause, rl.code, rl.status = err, code, status
	return true
}

// finish closes the request's log to later causes and returns the one it
// holds, if any.
func (rl *requestLog) finish() (cause error, code string, status int) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	rl.done = true
	return rl.cause, rl.code, rl.status
}

// withoutRequest is ctx without what belongs to the request it came with
// (its log, its id, its span) but with its other values: the context of an
// MCP session that the request starts, which the session's later calls
// inherit (the SDK makes its connection with the first request's context)
// and which must not write into that request's log, long written, nor
// carry its id and trace.
func withoutRequest(ctx context.Context) context.Context {
	return trace.ContextWithSpanContext(requestless{ctx}, trace.SpanContext{})
}

// requestless hides a request's log and id.
type requestless struct{ context.Context }

func (c requestless) Value(k any) any {
	switch k.(type) {
	case requestLogKey, requestIDKey:
		return nil
	}
	return c.Context.Value(k)
}

type requestLogKey struct{}

func requestLogOf(ctx context.Context) *requestLog {
	rl, _ := ctx.Value(requestLogKey{}).(*requestLog)
	return rl
}
