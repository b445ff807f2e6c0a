package api

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
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
		name := route
		if path == "/" || path == "" {
			path, name = "", r.Method
		} else if name == path {
			name = r.Method + " " + path
		}
		rl := &requestLog{}
		ctx := context.WithValue(r.Context(), requestLogKey{}, rl)
		ctx = telemetry.FromHeader(ctx, r.Header)
		ctx, span := telemetry.ServerSpan(ctx, name,
			attribute.String("http.request.method", r.Method), attribute.String("http.route", path))
		rw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(rw, r.WithContext(ctx))
		if rw.status == 0 {
			rw.status = http.StatusOK
		}
		span.SetAttributes(attribute.Int("http.response.status_code", rw.status))
		telemetry.EndServerSpan(span, rw.status)
		// An MCP call's error is answered in a 200: the level is the
		// error's too.
		status := max(rw.status, rl.status)
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
		attrs := []slog.Attr{slog.String("request_id", RequestID(ctx)), slog.String("method", r.Method),
			slog.String("route", name), slog.Int("status", rw.status), slog.Int64("bytes", rw.bytes),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000)}
		msg := "request"
		if rl.cause != nil {
			msg = "request failed"
			attrs = append(attrs, slog.String("code", rl.code), slog.String("err", rl.cause.Error()))
		}
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
		}
		s.log.LogAttrs(ctx, level, msg, attrs...)
	})
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
// an answer that hid it.
type requestLog struct {
	cause  error
	code   string
	status int
}

type requestLogKey struct{}

func requestLogOf(ctx context.Context) *requestLog {
	rl, _ := ctx.Value(requestLogKey{}).(*requestLog)
	return rl
}
