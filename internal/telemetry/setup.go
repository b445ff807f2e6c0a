// Package telemetry is Stockade's OpenTelemetry tracing and its phase
// metrics: the tracer provider the daemon sets up from the standard OTEL_*
// variables (off unless they ask for OTLP), one span per phase of an
// invocation, and the Prometheus histogram of the phases' durations by
// tier and outcome, recorded whether tracing is on or not.
//
//	shutdown, err := telemetry.Setup(ctx, os.Getenv, "v1.2.3")
//	defer shutdown(context.Background())
//	...
//	ctx, sp := telemetry.Start(ctx, telemetry.Policy)
//	defer sp.End(&err)
//
// What a span may carry is declared here (attrs.go): names, ids, tiers and
// outcomes, never code, output, stdin, parameters or secrets.
// docs/design.md §11 says why; docs/telemetry.md lists the spans.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/stockade-sh/stockade/errdefs"
)

// Enabled reports whether the OTEL_* variables (read with getenv) ask for
// traces: OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) with
// OTEL_TRACES_EXPORTER unset; never with OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none. Unset, tracing is off: the default.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "otlp":
		return true
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	default:
		return false
	}
}

// Setup installs Stockade's tracer provider when the OTEL_* variables ask
// for traces (Enabled), exporting them over OTLP/HTTP (protobuf) in
// batches. The SDK reads the rest of the standard variables itself: the
// endpoint, headers, timeout and compression (OTEL_EXPORTER_OTLP_*), the
// sampler (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG; default
// parentbased_always_on), the batching (OTEL_BSP_*), the span limits and
// the resource (OTEL_SERVICE_NAME, default "stockade";
// OTEL_RESOURCE_ATTRIBUTES). getenv is the daemon's environment, which only
// cmd/ reads (os.Getenv).
//
// An exporter other than otlp, or an OTLP protocol other than
// http/protobuf, is refused (ErrInvalidArgument) rather than ignored.
// shutdown flushes the spans still buffered, within ctx, and puts back the
// tracer there was before; with tracing off it does nothing. Setup sets
// no global provider (otel.SetTracerProvider).
func Setup(ctx context.Context, getenv func(string) string, version string) (shutdown func(context.Context) error, err error) {
	nothing := func(context.Context) error { return nil }
	if exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp != "" && exp != "otlp" && exp != "none" {
		return nothing, errdefs.Publicf("OTEL_TRACES_EXPORTER=%s: only otlp (over HTTP) or none is built in: %w", exp, errdefs.ErrInvalidArgument)
	}
	if !Enabled(getenv) {
		return nothing, nil
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto != "" && proto != "http/protobuf" {
		return nothing, errdefs.Publicf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: only http/protobuf is built in (a collector's port 4318): %w", proto, errdefs.ErrInvalidArgument)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nothing, fmt.Errorf("creating the OTLP trace exporter: %w", err)
	}
	// Ours first: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "stockade"), attribute.String("service.version", version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nothing, fmt.Errorf("describing the trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	// Stockade's own tracer only: the global provider stays the no-op
	// one, so that libraries instrumented through it (the Docker client's
	// otelhttp, which pings the engine in the background) add no traces
	// of their own.
	prev := tracer.Load()
	on := &holder{tp.Tracer(scope)}
	tracer.Store(on)
	onTracer.Store(on)
	return func(ctx context.Context) error {
		onTracer.Store(nil)
		tracer.Store(prev)
		return tp.Shutdown(ctx)
	}, nil
}

// Endpoint is where the OTLP exporter sends spans, as the OTEL_*
// variables (read with getenv) say, for the daemon's log: without a user
// and password, a query or a fragment, which may hold credentials. An
// endpoint that is no URL is named by that fact alone.
func Endpoint(getenv func(string) string) string {
	e := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if e == "" {
		e = getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if e == "" {
		return "http://localhost:4318"
	}
	u, err := url.Parse(e)
	if err != nil || u.Host == "" {
		return "(not a URL)"
	}
	u.User, u.RawQuery, u.Fragment, u.RawFragment, u.ForceQuery = nil, "", "", "", false
	return u.String()
}

// onTracer is Setup's tracer while it is set up, for SetTracing.
var onTracer atomic.Pointer[holder]

// SetTracing stops recording spans (false) or records them again (true)
// while Setup's provider stays set up; it does nothing when tracing was
// not set up. It is for a benchmark that compares tracing on and off in
// one process, interleaved; the daemon never calls it.
func SetTracing(on bool) {
	t := onTracer.Load()
	switch {
	case t == nil:
	case on:
		tracer.Store(t)
	default:
		tracer.Store(off)
	}
}

// scope is the instrumentation scope of Stockade's spans.
const scope = "github.com/stockade-sh/stockade"

// holder lets an atomic.Pointer hold an interface.
type holder struct{ trace.Tracer }
