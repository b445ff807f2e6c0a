package hostids

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// testFirst starts a range outside sandbox's range, so that tests never take the
// slots of real sandboxes even with the real directory.
const testFirst uint32 = sandbox.FirstHostID + 2*sandbox.HostIDSlots

func newAllocator(t *testing.T, slots uint32) *Allocator {
	t.Helper()
	return &Allocator{Dir: t.TempDir(), First: testFirst, Slots: slots}
}

// holders makes n directories to hold slots.
func holders(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for i := range n {
		d := filepath.Join(t.TempDir(), strconv.Itoa(i))
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// TestAllocateDistinct has as many concurrent allocations as there are
// slots, from two allocators over one directory (two driver instances):
// every one gets a range of its own, and one more finds none free until a
// lease is released.
func TestAllocateDistinct(t *testing.T) {
	const slots = 32
	a := newAllocator(t, slots)
	b := *a
	hs := holders(t, slots+1)
	leases := make([]*Lease, slots)
	errs := make([]error, slots)
	var wg sync.WaitGroup
	for i := range slots {
		alloc := a
		if i%2 == 1 {
			alloc = &b
		}
		wg.Go(func() { leases[i], errs[i] = alloc.Allocate(hs[i]) })
	}
	wg.Wait()
	seen := map[uint32]bool{}
	for i, l := range leases {
		if errs[i] != nil {
			t.Fatalf("allocation %d: %v", i, errs[i])
		}
		if !a.inRange(l.Base) || seen[l.Base] {
			t.Fatalf("allocation %d: got base %d, want a distinct slot of the range (have %v)", i, l.Base, seen)
		}
		seen[l.Base] = true
	}
	if _, err := a.Allocate(hs[slots]); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("one more: got %v, want ErrResourceExhausted", err)
	}
	freed := leases[7].Base
	if err := leases[7].Release(); err != nil {
		t.Fatal(err)
	}
	if err := leases[7].Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
	l, err := b.Allocate(hs[slots])
	if err != nil || l.Base != freed {
		t.Fatalf("after a release: got %v, %v, want base %d", l, err, freed)
	}
}

// TestAllocateAcrossProcesses has another process hold half the slots:
// this one gets the other half only. Once it is killed, its slots stay in
// use while their holders exist (its sandboxes may still run), and are
// handed out again when they are gone.
func TestAllocateAcrossProcesses(t *testing.T) {
	const slots = 8
	a := newAllocator(t, slots)
	theirs := holders(t, slots/2)
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), "HOSTIDS_HELPER="+a.Dir)
	for _, h := range theirs {
		child.Args = append(child.Args, h)
	}
	stdin, _ := child.StdinPipe()
	stdout, _ := child.StdoutPipe()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	taken := map[uint32]bool{}
	sc := bufio.NewScanner(stdout)
	for range theirs {
		if !sc.Scan() {
			t.Fatalf("the other process ended early: %v", sc.Err())
		}
		base, err := strconv.ParseUint(sc.Text(), 10, 32)
		if err != nil {
			t.Fatalf("the other process said %q", sc.Text())
		}
		taken[uint32(base)] = true
	}
	ours := holders(t, slots/2+1)
	for i := range slots / 2 {
		l, err := a.Allocate(ours[i])
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if taken[l.Base] {
			t.Fatalf("got base %d, which the other process holds", l.Base)
		}
	}
	if _, err := a.Allocate(ours[slots/2]); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("with every slot held: got %v, want ErrResourceExhausted", err)
	}
	child.Process.Kill()
	child.Wait()
	stdin.Close()
	if _, err := a.Allocate(ours[slots/2]); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("after the other process died, its holders still there: got %v, want ErrResourceExhausted", err)
	}
	os.Remove(theirs[0])
	l, err := a.Allocate(ours[slots/2])
	if err != nil || !taken[l.Base] {
		t.Fatalf("after a dead process's holder is gone: got %v, %v, want its slot", l, err)
	}
}

// TestMain runs the other process of TestAllocateAcrossProcesses when
// HOSTIDS_HELPER names its directory: it allocates a slot for each holder
// argument, prints the bases and holds them until it is killed.
func TestMain(m *testing.M) {
	dir := os.Getenv("HOSTIDS_HELPER")
	if dir == "" {
		os.Exit(m.Run())
	}
	a := &Allocator{Dir: dir, First: testFirst, Slots: 8}
	for _, h := range os.Args[1:] {
		l, err := a.Allocate(h)
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println(l.Base)
	}
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestAdoptAndForget checks the slots of sandboxes found on the host: an
// adopted slot is not handed out while its holder exists, cannot be
// adopted by another holder, and is free again once forgotten.
func TestAdoptAndForget(t *testing.T) {
	a := newAllocator(t, 2)
	hs := holders(t, 3)
	base := uint32(testFirst + 2)
	if err := a.Adopt(base, hs[0]); err != nil {
		t.Fatal(err)
	}
	if err := a.Adopt(base, hs[1]); !errdefs.IsConflict(err) {
		t.Errorf("adopting a slot in use: got %v, want ErrConflict", err)
	}
	if err := a.Adopt(testFirst+1, hs[1]); !errdefs.IsInvalidArgument(err) {
		t.Errorf("adopting an odd id: got %v, want ErrInvalidArgument", err)
	}
	l, err := a.Allocate(hs[1])
	if err != nil || l.Base != testFirst {
		t.Fatalf("got %v, %v, want the other slot %d", l, err, testFirst)
	}
	if _, err := a.Allocate(hs[2]); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("got %v, want ErrResourceExhausted", err)
	}
	if err := a.Forget(base, hs[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(hs[2]); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("forgotten by another holder: got %v, want the slot still in use", err)
	}
	if err := a.Forget(base, hs[0]); err != nil {
		t.Fatal(err)
	}
	if l, err := a.Allocate(hs[2]); err != nil || l.Base != base {
		t.Fatalf("after Forget: got %v, %v, want base %d", l, err, base)
	}
}
