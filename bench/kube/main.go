// Command kube measures the kubernetes driver (driver/kubernetes) side by
// side with the local gVisor driver, on the same machine and the same
// images with the same guest, on the test cluster of scripts/kube (a
// single node: this machine). Its pods run with the cluster's RuntimeClasses
// that have no network: runc-nonet (runc) and gvisor-nonet (runsc
// --network=none). It prints, the first three tables from variants
// interleaved in one run so that machine noise hits them alike, the last
// from loops run one after the other:
//
//   - one-shot python print(1), at the driver, as the engine's one-shot
//     runs it: a sandbox created, the program run through the guest, the
//     sandbox destroyed; on a cold pod of each RuntimeClass against a cold
//     local gVisor sandbox, then with the sandbox created ahead (before
//     the timer), and pooled: created unbound ahead (CreateUnbound),
//     then bound (Bind, timed with the first result), run and destroyed,
//     what a warm pool's hit costs at the driver;
//   - a session's first cell: its sandbox created (a pod, reached over its
//     attach stream; locally detached, through the shim, as the engine's
//     sessions are), its python kernel started (sandbox.Kernels) and a
//     first cell print(1) run, cold and created ahead;
//   - the attach stream's cost per cell: -cells cells print(1) a round in
//     one live kernel of each, against a local sandbox's of the same
//     runtime (runc, gVisor) through its shim, as a session's, and, for
//     reference, a local gVisor sandbox's direct (the daemon holding the
//     guest's pipe);
//   - pods per minute: create, run, destroy in a loop, -concurrency at
//     once (a loop for each number of the list), -pods of each driver or
//     until -pods-time has passed (no new one starts then), one loop after
//     the other, the drivers in turn; with -qps, also on kubernetes
//     drivers whose API client is allowed that many requests a second
//     (the daemon's has kubernetes.DefaultQPS).
//
// It needs root, runsc and the python image (`make setup`), a cluster
// (scripts/kube/up.sh with STOCKADE_KUBE_POD_PIDS_LIMIT=320, which gVisor
// pods need), its kubeconfig and the node's containerd client to import
// the image (what scripts/kube/test.sh exports for the cluster tests). It
// builds the guest as the tests do (so that the node may have its image
// already) and the stockade binary for the local shim, from the
// repository's root, keeps the local drivers' state in a temporary
// directory under -state-dir, and deletes its pods (its own owner label)
// when it ends, also on error.
//
//	scripts/kube/up.sh ... (see docs/kubernetes.md)
//	go run ./bench/kube [-n 10] [-cells 20] [-pods 30] [-concurrency 2,4] [-qps 50]
//	scripts/kube/down.sh
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/kubernetes"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/sandbox"
)

// flags are the command's flags.
type flags struct {
	n, cells, pods, qps    int
	concurrency            []int
	podsTime               time.Duration
	runcClass, gvisorClass string
	dataDir, stateDir      string
	cluster                clusterOpts
}

func main() {
	var f flags
	flag.IntVar(&f.n, "n", 10, "rounds of the one-shot and first-cell variants, and of the cells")
	flag.IntVar(&f.cells, "cells", 20, "cells of each live kernel a round")
	flag.IntVar(&f.pods, "pods", 30, "pods (sandboxes) of each driver in the pods-per-minute loop")
	conc := flag.String("concurrency", "2,4", "sandboxes at once in the pods-per-minute loop, a comma-separated list: a loop each")
	flag.IntVar(&f.qps, "qps", 0, "if set, the pods-per-minute loops run also on kubernetes drivers whose API client may send this many requests a second (burst twice that) instead of the driver's default (kubernetes.DefaultQPS, which the daemon's driver has)")
	flag.DurationVar(&f.podsTime, "pods-time", 3*time.Minute, "no new sandbox starts in a driver's pods-per-minute loop after this")
	flag.StringVar(&f.cluster.kubeconfig, "kubeconfig", os.Getenv("STOCKADE_TEST_KUBECONFIG"), "the cluster's kubeconfig (default $STOCKADE_TEST_KUBECONFIG)")
	ctr := flag.String("ctr", os.Getenv("STOCKADE_TEST_KUBE_CTR"), "the node's containerd client, to import the image: `ctr --address SOCK` (default $STOCKADE_TEST_KUBE_CTR)")
	flag.StringVar(&f.cluster.namespace, "namespace", "stockade-bench", "namespace of the pods (created if missing)")
	flag.StringVar(&f.cluster.seccompDir, "seccomp-dir", "/var/lib/stockade-kube/kubelet/seccomp", "the kubelet's seccomp directory")
	flag.StringVar(&f.runcClass, "runc-class", "runc-nonet", "RuntimeClass of the runc pods")
	flag.StringVar(&f.gvisorClass, "gvisor-class", "gvisor-nonet", "RuntimeClass of the gVisor pods")
	flag.StringVar(&f.dataDir, "data-dir", config.Default().DataDir, "image store")
	flag.StringVar(&f.stateDir, "state-dir", "/run", "parent of the local drivers' temporary state directory")
	flag.Parse()
	f.cluster.ctr = strings.Fields(*ctr)
	for _, c := range strings.Split(*conc, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || v < 1 {
			fmt.Fprintf(os.Stderr, "bench/kube: -concurrency %q: want positive integers\n", *conc)
			os.Exit(2)
		}
		f.concurrency = append(f.concurrency, v)
	}
	if f.cluster.kubeconfig == "" || len(f.cluster.ctr) == 0 {
		fmt.Fprintln(os.Stderr, "bench/kube: no cluster: set -kubeconfig and -ctr (or STOCKADE_TEST_KUBECONFIG and STOCKADE_TEST_KUBE_CTR, as scripts/kube/test.sh does)")
		os.Exit(2)
	}
	if f.n < 1 || f.cells < 1 || f.pods < 1 {
		fmt.Fprintln(os.Stderr, "bench/kube: -n, -cells and -pods must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, f)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/kube:", err)
		os.Exit(1)
	}
}

// target is a driver that the benchmark compares.
type target struct {
	name   string
	driver sandbox.Driver
	// detach makes a session's sandbox detached (through the shim), as
	// the engine's sessions on a driver that can re-attach are.
	detach bool
}

func run(ctx context.Context, f flags) (err error) {
	img, err := image.Open(f.dataDir).Resolve("python")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "stockade-bench-kube-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	shim, guest, err := binaries(tmp)
	if err != nil {
		return err
	}
	f.cluster.guest = guest
	state, err := os.MkdirTemp(f.stateDir, "stockade-bench-kube-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	gv, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(state, "gvisor"), GuestPath: guest, Shim: shim})
	if err != nil {
		return err
	}
	rc, err := runc.New(runc.Config{StateDir: filepath.Join(state, "runc"), GuestPath: guest, Shim: shim})
	if err != nil {
		return err
	}

	if err := ensureNamespace(ctx, f.cluster.kubeconfig, f.cluster.namespace); err != nil {
		return err
	}
	var kds []*kubernetes.Driver
	defer func() {
		if rerr := reap(kds); err == nil {
			err = rerr
		}
	}()
	// kubes are the kubernetes targets, the runc pods' then the gVisor
	// pods', with the client's rate limit at qps (0: the driver's
	// default, as the daemon's driver has it).
	kubes := func(qps int) ([]target, error) {
		var ts []target
		for _, c := range []struct {
			tier  sandbox.Tier
			class string
		}{{sandbox.TierContainer, f.runcClass}, {sandbox.TierGVisor, f.gvisorClass}} {
			d, err := kubeDriver(ctx, f.cluster, c.tier, c.class, qps)
			if err != nil {
				return nil, err
			}
			kds = append(kds, d)
			name := "kubernetes " + c.class
			if qps > 0 {
				name += fmt.Sprintf(", client QPS %d", qps)
			}
			ts = append(ts, target{name: name, driver: d})
		}
		return ts, nil
	}
	ks, err := kubes(0)
	if err != nil {
		return err
	}
	if err := importImage(ctx, f.cluster, img, tmp); err != nil {
		return err
	}
	local := target{name: "local gvisor", driver: gv, detach: true}
	all := append(ks[:len(ks):len(ks)], local)

	sum, err := kubernetes.GuestDigest(guest)
	if err != nil {
		return err
	}
	fmt.Printf("bench/kube %s UTC, load average %s, python image %s, guest sha256:%s\n\n",
		time.Now().UTC().Format("2006-01-02 15:04"), loadAvg(), img.Digest[:19], sum[:12])

	if err := startTables(ctx, f.n, all, img); err != nil {
		return err
	}
	if err := cellTable(ctx, f.n, f.cells, ks, rc, gv, img); err != nil {
		return err
	}
	rateTargets := all
	if f.qps > 0 {
		fast, err := kubes(f.qps)
		if err != nil {
			return err
		}
		rateTargets = append(fast, all...)
	}
	if err := rateTable(ctx, rateTargets, img, f.pods, f.concurrency, f.podsTime); err != nil {
		return err
	}
	fmt.Printf("\nload average at the end: %s\n", loadAvg())
	return nil
}

// binaries builds, into dir, the guest as the tests build it
// (internal/testenv: `go build -trimpath`, so that the node may have the
// image with this guest already) and the stockade binary for the local
// gVisor driver's shim, and returns the shim's command and the guest's
// path. It runs `go build` from the module's root.
func binaries(dir string) (shim []string, guest string, err error) {
	guest, bin := filepath.Join(dir, "stockade-guest"), filepath.Join(dir, "stockade")
	for _, b := range [][]string{{"-trimpath", "-o", guest, "./cmd/stockade-guest"}, {"-o", bin, "./cmd/stockade"}} {
		cmd := exec.Command("go", append([]string{"build"}, b...)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, "", fmt.Errorf("go build %s (run from the module's root): %v\n%s", b[len(b)-1], err, out)
		}
	}
	return []string{bin, "shim"}, guest, nil
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// ratio is a's median against b's, empty without b.
func ratio(a, b *table.Variant) string {
	if b == nil {
		return ""
	}
	return table.Ratio(a.Pct(50), b.Pct(50))
}
