package engine

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// BenchmarkSessionSnapshot snapshots, b.N times, a gVisor python session
// holding a 100 MiB DataFrame, and reports the source's stall (the time a
// cell on it could not run: stall-ms, the longest, and stall-p50-ms), the
// part of it its guest was frozen (frozen-ms, the longest) and the
// snapshot's size (MiB). Each snapshot starts a session, whose frame
// must be the source's. Run it with -benchtime=3x.
func BenchmarkSessionSnapshot(b *testing.B) {
	testenv.RequiresRoot(b)
	testenv.RequiresBinary(b, "runsc")
	ctx := context.Background()
	d, err := gvisor.New(gvisor.Config{StateDir: b.TempDir(), GuestPath: testenv.Guest(b), Shim: testenv.Shim(b)})
	if err != nil {
		b.Fatal(err)
	}
	e, err := New(map[string]sandbox.Driver{"gvisor": d}, "gvisor", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		b.Fatal(err)
	}
	labels := map[string]string{LabelOwner: poolOwner, LabelWorkspace: "ws_bench", LabelSession: "ses_source"}
	spec := SessionSpec{Runtime: "python", Driver: "gvisor", Workspace: poolWorkspace, Labels: labels}
	src, err := e.OpenSession(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close(ctx)
	cell := func(s *Session, code string) string {
		r, err := s.Cell(ctx, CellRequest{Code: code, Timeout: time.Minute})
		if err != nil || r.Status != "succeeded" {
			b.Fatalf("cell %q: %+v, %v", code, r, err)
		}
		return strings.TrimSpace(string(r.Stdout))
	}
	if got := cell(src, "import numpy as np, pandas as pd\ndf = pd.DataFrame({'a': np.arange(13107200, dtype='int64')})\nprint(len(df))"); got != "13107200" {
		b.Fatalf("the frame: got %s", got)
	}
	var frozen, stalls []time.Duration
	defer func(old func(time.Duration, time.Duration)) { snapshotTaken = old }(snapshotTaken)
	snapshotTaken = func(f, s time.Duration) { frozen, stalls = append(frozen, f), append(stalls, s) }
	var bytes int64
	dirs := b.TempDir()
	b.ResetTimer()
	for i := range b.N {
		dir := filepath.Join(dirs, strconv.Itoa(i))
		n, _, err := e.SnapshotSession(ctx, src, dir, nil)
		if err != nil {
			b.Fatal(err)
		}
		bytes = n
		b.StopTimer()
		fork := spec
		fork.Labels = map[string]string{LabelOwner: poolOwner, LabelWorkspace: "ws_bench", LabelSession: "ses_fork_" + strconv.Itoa(i)}
		s, err := e.StartFromSnapshot(ctx, fork, dir)
		if err != nil {
			b.Fatal(err)
		}
		if got := cell(s, "print(len(df))"); got != "13107200" {
			b.Fatalf("the fork's frame: got %s", got)
		}
		_ = s.Close(ctx)
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(stalls)
	b.ReportMetric(float64(stalls[len(stalls)-1].Milliseconds()), "stall-ms")
	b.ReportMetric(float64(stalls[len(stalls)/2].Milliseconds()), "stall-p50-ms")
	b.ReportMetric(float64(slices.Max(frozen).Milliseconds()), "frozen-ms")
	b.ReportMetric(float64(bytes)/(1<<20), "MiB")
	b.Logf("the source's stall over %d snapshots, sorted: %v; its guest frozen, in order: %v", len(stalls), stalls, frozen)
}
