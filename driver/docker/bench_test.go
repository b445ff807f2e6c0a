package docker_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// BenchmarkOneShot measures a one-shot python print(1) through the driver:
// Create, one Exec, Destroy, as the engine runs an invocation. The image is
// imported before the clock starts. It reports the median and p95 besides
// the mean.
//
//	STOCKADE_TEST_DOCKER_HOST=$(scripts/dockerd.sh start /tmp/sdk) go test ./driver/docker -run '^$' -bench OneShot -benchtime 30x
func BenchmarkOneShot(b *testing.B) {
	d := engine(b)
	img := testenv.Image(b, "python")
	ctx := b.Context()
	if _, err := d.ImportImage(ctx, img); err != nil {
		b.Fatal(err)
	}
	var durs []time.Duration
	for b.Loop() {
		start := time.Now()
		sb, err := d.Create(ctx, sandbox.Spec{Image: img})
		if err != nil {
			b.Fatal(err)
		}
		res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{
			File: sandbox.File{Name: "main.py", Data: []byte("print(1)")},
			Argv: []string{"/usr/bin/python3", "{file}"},
		})
		if derr := sb.Destroy(context.WithoutCancel(ctx)); derr != nil {
			b.Fatal(derr)
		}
		if err != nil {
			b.Fatal(err)
		}
		if res.Status != sandbox.StatusSucceeded || string(res.Stdout) != "1\n" {
			b.Fatalf("got %s %q, want succeeded \"1\\n\"", res.Status, res.Stdout)
		}
		durs = append(durs, time.Since(start))
	}
	slices.Sort(durs)
	b.ReportMetric(float64(durs[len(durs)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(durs[(len(durs)*95+99)/100-1].Microseconds())/1000, "p95-ms")
}
