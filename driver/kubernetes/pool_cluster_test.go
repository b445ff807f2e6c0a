//go:build kubecluster

package kubernetes_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/kubernetes"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// poolWatch is a PoolObserver that counts hits, misses and refills.
type poolWatch struct {
	mu                    sync.Mutex
	hits, misses, refills int
	size                  int
}

func (w *poolWatch) PoolSize(_ string, n int) { w.mu.Lock(); w.size = n; w.mu.Unlock() }
func (w *poolWatch) PoolHit(string)           { w.mu.Lock(); w.hits++; w.mu.Unlock() }
func (w *poolWatch) PoolMiss(string)          { w.mu.Lock(); w.misses++; w.mu.Unlock() }
func (w *poolWatch) PoolRefill(string, time.Duration) {
	w.mu.Lock()
	w.refills++
	w.mu.Unlock()
}

func (w *poolWatch) counts() (hits, misses, refills int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hits, w.misses, w.refills
}

// bindSpy is the driver, reading each bound pod's labels back from the
// cluster right after its Bind.
type bindSpy struct {
	*kubernetes.Driver
	mu    sync.Mutex
	bound map[string]map[string]string // sandbox ID: its pod's labels
}

func (b *bindSpy) Bind(ctx context.Context, sb sandbox.Sandbox, bnd sandbox.Binding) error {
	if err := b.Driver.Bind(ctx, sb, bnd); err != nil {
		return err
	}
	l, err := b.Driver.Labels(ctx, sb.ID())
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.bound[sb.ID()] = l
	b.mu.Unlock()
	return nil
}

// TestClusterPool runs an engine with a one-shot python pool of one pod
// on the cluster (runc pods): a run is a pool hit on a pod bound with the
// run's labels, a file the first run leaves in /tmp is not there for the
// second (another pod), each used pod is deleted, and the pool refills.
// A run with a tighter memory limit runs cold (BindFixedLimits).
func TestClusterPool(t *testing.T) {
	d, _ := cluster(t, sandbox.TierContainer)
	ctr := strings.Fields(os.Getenv("STOCKADE_TEST_KUBE_CTR"))
	importImage(t, ctr, testenv.Image(t, "python"), testenv.Guest(t))
	spy := &bindSpy{Driver: d, bound: map[string]map[string]string{}}
	e, err := engine.New(map[string]sandbox.Driver{"kubernetes": spy}, "kubernetes", image.Open(testenv.DataDir()),
		sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		engine.WithPools(engine.PoolOptions{Pools: []engine.PoolSpec{{Runtime: "python", Size: 1}}, CheckpointDir: t.TempDir()}))
	if err != nil {
		t.Fatal(err)
	}
	watch := &poolWatch{}
	e.SetPoolObserver(watch)
	stop, err := e.StartPools(t.Context(), map[string]string{engine.LabelOwner: "kubedriver-pool-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		_, _ = d.Reap(context.Background(), map[string]string{engine.LabelOwner: "kubedriver-pool-test"})
	})
	// refilled waits until the pool has made n pods and holds one.
	refilled := func(n int) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			_, _, r := watch.counts()
			watch.mu.Lock()
			size := watch.size
			watch.mu.Unlock()
			if r >= n && size >= 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the pool did not refill: %d pods made, %d ready; want %d made, one ready", r, size, n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// gone waits until the pod of sandbox id is deleted.
	gone := func(id string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for left := d.Leftovers(t.Context(), id); len(left) > 0; left = d.Leftovers(t.Context(), id) {
			if time.Now().After(deadline) {
				t.Fatalf("the pod of used sandbox %s is still there: %v", id, left)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	run := func(execution, code string, limits sandbox.Limits) *engine.Result {
		t.Helper()
		res, err := e.Run(t.Context(), engine.Request{Runtime: "python", Code: []byte(code), Limits: limits,
			Labels: map[string]string{engine.LabelExecution: execution}})
		if err != nil {
			t.Fatalf("run %s: %v", execution, err)
		}
		return res
	}
	boundOf := func(execution string) (string, map[string]string) {
		spy.mu.Lock()
		defer spy.mu.Unlock()
		for id, l := range spy.bound {
			if l[engine.LabelExecution] == execution {
				return id, l
			}
		}
		return "", nil
	}

	refilled(1)
	res := run("pool-a", "open('/tmp/left', 'w').write('tenant A')\nprint('left')", sandbox.Limits{})
	if res.Stdout != "left\n" {
		t.Fatalf("run a: %+v", res)
	}
	if hits, misses, _ := watch.counts(); hits != 1 || misses != 0 {
		t.Errorf("after run a: %d hits, %d misses; want a hit", hits, misses)
	}
	idA, labels := boundOf("pool-a")
	if idA == "" || labels[engine.LabelPool] == "" || labels[engine.LabelOwner] != "kubedriver-pool-test" {
		t.Fatalf("the bound pods' labels: %v; want run a's with its pool's and owner's", spy.bound)
	}
	gone(idA)

	refilled(2)
	res = run("pool-b", "import os\nprint(sorted(os.listdir('/tmp')))", sandbox.Limits{})
	if res.Stdout != "['main.py']\n" {
		t.Errorf("run b saw /tmp %q (stderr %q), want its program only: no bleed from run a", res.Stdout, res.Stderr)
	}
	idB, _ := boundOf("pool-b")
	if hits, _, _ := watch.counts(); hits != 2 || idB == "" || idB == idA {
		t.Errorf("run b: %d hits, pod %q (a's %q); want a hit on another pod", hits, idB, idA)
	}
	gone(idB)

	// A tighter memory limit than the pool's pods have: a miss, run cold.
	refilled(3)
	res = run("pool-c", "print('cold')", sandbox.Limits{Memory: 256 << 20})
	if hits, misses, _ := watch.counts(); res.Stdout != "cold\n" || hits != 2 || misses != 1 {
		t.Errorf("run c with tighter memory: %q, %d hits, %d misses; want a miss, run cold", res.Stdout, hits, misses)
	}
}
