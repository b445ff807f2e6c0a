// Command docker measures the docker tier's one-shot run side by side with
// a plain `docker run` of the same image under the same flags and with the
// runc and gvisor tiers, interleaved in one run so that machine noise hits
// every variant alike. Every variant runs python print(1):
//
//   - `stockade run --driver docker|runc|gvisor`: the whole CLI (process
//     start, configuration, create, exec, destroy);
//   - `docker run` from the docker CLI with the flags that express the
//     driver's profile (driver/docker/profile.go: read-only root, /tmp
//     tmpfs, no capabilities, no-new-privileges, Stockade's seccomp profile,
//     pids, memory without swap, half a CPU, nobody:nogroup, no network)
//     on the image the driver imported, python started directly as PID 1
//     (no guest agent, no code delivery);
//   - the engine's one-shot run in process (what the daemon does per
//     invocation) on each driver.
//
// It needs root, the runtimes and images of `make setup`, a built stockade
// binary and a dockerd, for instance a private one from scripts/dockerd.sh:
//
//	make build
//	export DOCKER_HOST=$(scripts/dockerd.sh start /tmp/sbd)
//	CGO_ENABLED=0 go run ./bench/docker [-n 30] [-stockade bin/stockade] [-docker docker]
//	scripts/dockerd.sh stop /tmp/sbd
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/stockade-sh/stockade/bench/internal/dockerrun"
	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/wiring"
)

func main() {
	n := flag.Int("n", 30, "runs of each variant")
	bin := flag.String("stockade", "bin/stockade", "stockade binary")
	dockerCLI := flag.String("docker", "docker", "docker CLI binary")
	host := flag.String("docker-host", os.Getenv("DOCKER_HOST"), "Docker Engine address, e.g. unix:///tmp/sbd/docker.sock (default $DOCKER_HOST)")
	dataDir := flag.String("data-dir", config.Default().DataDir, "image store")
	flag.Parse()
	if *host == "" {
		fmt.Fprintln(os.Stderr, "docker: no Docker Engine: set DOCKER_HOST or -docker-host (scripts/dockerd.sh start DIR prints one)")
		os.Exit(2)
	}
	if err := run(context.Background(), *n, *bin, *dockerCLI, *host, *dataDir); err != nil {
		fmt.Fprintln(os.Stderr, "docker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, n int, bin, dockerCLI, host, dataDir string) error {
	cfg := config.Default()
	cfg.DataDir, cfg.DockerHost = dataDir, host
	dockerRun, cleanup, err := dockerrun.Argv(ctx, dockerCLI, host, dataDir, "-c", "print(1)")
	if err != nil {
		return err
	}
	defer cleanup()

	eng, err := wiring.Engine(cfg)
	if err != nil {
		return err
	}
	inProcess := func(driver string) func() error {
		return func() error {
			res, err := eng.Run(ctx, engine.Request{Runtime: "python", Driver: driver, Code: []byte("print(1)")})
			if err == nil && res.Stdout != "1\n" {
				err = fmt.Errorf("unexpected result %+v", res)
			}
			return err
		}
	}
	// The CLI reads the engine's address from DOCKER_HOST, as the docker
	// CLI does.
	env := []string{"DOCKER_HOST=" + host}
	cli := func(argv ...string) func() error { return table.Command("1\n", env, argv...) }
	stockade := func(driver string) func() error {
		return cli(bin, "run", "--driver", driver, "--runtime", "python", "-c", "print(1)")
	}
	vs := []*table.Variant{
		{Name: "stockade run --driver docker", Run: stockade("docker")},
		{Name: "docker run (same flags, CLI)", Run: cli(dockerRun...)},
		{Name: "stockade run --driver runc", Run: stockade("runc")},
		{Name: "stockade run --driver gvisor", Run: stockade("gvisor")},
		{Name: "engine one-shot, docker (daemon)", Run: inProcess("docker")},
		{Name: "engine one-shot, runc (daemon)", Run: inProcess("runc")},
		{Name: "engine one-shot, gvisor (daemon)", Run: inProcess("gvisor")},
	}
	if err := table.Interleave(n, vs); err != nil {
		return err
	}
	base := vs[1]
	fmt.Printf("one-shot python print(1), %d runs each, interleaved; dockerd %s\n\n", n, host)
	t := table.New("variant", "median", "p95", "median vs docker run")
	for _, v := range vs {
		t.Row(v.Name, table.MS(v.Pct(50)), table.MS(v.Pct(95)), table.Ratio(v.Pct(50), base.Pct(50)))
	}
	t.Print(os.Stdout)
	return nil
}
