package ocidriver_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// BenchmarkRestoreMany restores 8 sandboxes at once from one checkpoint
// of a shell sandbox holding 100 MiB in /tmp (a fork of 8's restores,
// without the engine's reseed and cells), each answering a command,
// against the same with 8 sandboxes created ahead (PrepareRestores, made
// before the timing starts: the best a fork whose creates ran while its
// source saved could get), interleaved. It prints the medians and their
// ratio; run it with -benchtime 5x.
func BenchmarkRestoreMany(b *testing.B) {
	testenv.RequiresRoot(b)
	testenv.RequiresBinary(b, "runsc")
	const n = 8
	d, err := gvisor.New(gvisor.Config{StateDir: b.TempDir(), GuestPath: testenv.Guest(b), Shim: testenv.Shim(b)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	defer func() {
		_ = d.DropPrepared(ctx)
		_, _ = d.Reap(ctx, nil)
	}()
	sb, err := d.CreateUnbound(ctx, sandbox.Spec{Image: testenv.Image(b, "shell"),
		Limits: sandbox.Limits{Memory: 512 << 20, TmpSize: 128 << 20}})
	if err != nil {
		b.Fatal(err)
	}
	if res, err := sandbox.Run(ctx, sb, shScript("head -c 104857600 /dev/urandom > /tmp/big && echo saved > /tmp/state")); err != nil || res.ExitCode != 0 {
		b.Fatalf("filling /tmp: %+v, %v", res, err)
	}
	dir := filepath.Join(b.TempDir(), "many")
	if err := d.Checkpoint(ctx, sb, dir); err != nil {
		b.Fatal(err)
	}
	restoreAll := func() time.Duration {
		start := time.Now()
		sbs := make([]sandbox.Sandbox, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				s, err := d.Restore(ctx, dir, nil)
				if err != nil {
					errs[i] = err
					return
				}
				sbs[i] = s
				res, err := sandbox.Run(ctx, s, shScript("cat /tmp/state"))
				if err == nil && strings.TrimSpace(string(res.Stdout)) != "saved" {
					err = fmt.Errorf("got %+v, want the saved state", res)
				}
				errs[i] = err
			})
		}
		wg.Wait()
		took := time.Since(start)
		for i, s := range sbs {
			if s != nil {
				_ = s.Destroy(ctx)
			}
			if errs[i] != nil {
				b.Fatalf("restore %d: %v", i, errs[i])
			}
		}
		return took
	}
	var plain, ahead []time.Duration
	restoreAll() // caches warm
	_, claimed0, _ := d.Prepared()
	b.ResetTimer()
	for round := 0; b.Loop(); round++ {
		for j := range 2 {
			if (j+round)%2 == 0 {
				plain = append(plain, restoreAll())
				continue
			}
			b.StopTimer()
			if err := d.PrepareRestores(ctx, dir, n); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			ahead = append(ahead, restoreAll())
		}
	}
	b.StopTimer()
	_, claimed, failed := d.Prepared()
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	fmt.Printf("\n8 restores at once of a shell sandbox holding 100 MiB in /tmp, each then running a command; median of %d each, interleaved\n\n", len(plain))
	fmt.Printf("| restores                          |    median | vs plain |\n")
	fmt.Printf("| --------------------------------- | --------: | -------: |\n")
	fmt.Printf("| plain (runsc restore of a new one) | %9s |    1.00x |\n", ms(med(plain)))
	fmt.Printf("| into 8 sandboxes created ahead     | %9s | %7.2fx |\n", ms(med(ahead)), float64(med(ahead))/float64(med(plain)))
	fmt.Printf("\n%d restores took a sandbox created ahead, %d of them fell back\n\n", claimed-claimed0, failed)
}
