// Command otlpsink is the OTLP receiver Stockade's telemetry test sends its
// traces to: the OpenTelemetry Collector's own otlpreceiver (OTLP over HTTP,
// protobuf and JSON, as a collector serves it) with a consumer that appends
// each batch it receives to a file as one line of OTLP JSON.
//
// It is its own module so that the collector's dependencies never enter
// Stockade's go.mod; scripts/otlpsink.sh builds it once per version into
// /usr/local/lib/stockade and the test runs that binary.
//
//	otlpsink -listen 127.0.0.1:4318 -out /tmp/spans.jsonl
//
// It prints "ready <addr>" once the receiver listens and stops on SIGTERM or
// SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:4318", "the OTLP/HTTP address to listen on")
	out := flag.String("out", "", "the file each received batch is appended to, one OTLP JSON line each")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "otlpsink: -out is required")
		os.Exit(2)
	}
	if err := run(*listen, *out); err != nil {
		fmt.Fprintln(os.Stderr, "otlpsink:", err)
		os.Exit(1)
	}
}

func run(listen, out string) error {
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	var mu sync.Mutex
	var marshal ptrace.JSONMarshaler
	sink, err := consumer.NewTraces(func(_ context.Context, td ptrace.Traces) error {
		b, err := marshal.MarshalTraces(td)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		_, err = f.Write(append(b, '\n'))
		return err
	})
	if err != nil {
		return err
	}

	factory := otlpreceiver.NewFactory()
	cfg := factory.CreateDefaultConfig().(*otlpreceiver.Config)
	cfg.Protocols.GRPC = configoptional.None[configgrpc.ServerConfig]()
	http := cfg.Protocols.HTTP.GetOrInsertDefault()
	http.ServerConfig.NetAddr.Endpoint = listen
	set := receiver.Settings{
		ID:                component.NewID(factory.Type()),
		TelemetrySettings: componenttest.NewNopTelemetrySettings(),
		BuildInfo:         component.NewDefaultBuildInfo(),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	r, err := factory.CreateTraces(ctx, set, cfg, sink)
	if err != nil {
		return err
	}
	if err := r.Start(ctx, componenttest.NewNopHost()); err != nil {
		return err
	}
	fmt.Println("ready", listen)
	<-ctx.Done()
	return r.Shutdown(context.Background())
}
