package runc_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/hostids"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// testFirst starts a range of host ids outside the real one, so that the
// tests' small ranges never meet real sandboxes.
const testFirst uint32 = sandbox.FirstHostID + 2*sandbox.HostIDSlots

// helperEnv, when set, makes the test binary the crashing process of
// TestHostIDsAfterCrash: "stateDir:idDir:guest:rootfs".
const helperEnv = "STOCKADE_RUNC_HOSTIDS_HELPER"

func TestMain(m *testing.M) {
	if v := os.Getenv(helperEnv); v != "" {
		crashingProcess(v)
		return
	}
	os.Exit(m.Run())
}

// crashingProcess creates one sandbox labelled crashed=yes, prints the host
// id its root is mapped to and waits to be killed.
func crashingProcess(v string) {
	f := strings.Split(v, ":")
	d, err := runc.New(runc.Config{StateDir: f[0], GuestPath: f[2], HostIDs: &hostids.Allocator{Dir: f[1], First: testFirst, Slots: 2}})
	if err == nil {
		var sb sandbox.Sandbox
		sb, err = d.Create(context0(), sandbox.Spec{Image: sandbox.Image{Rootfs: f[3]}, Labels: map[string]string{"crashed": "yes"}})
		if err == nil {
			fmt.Println(hostUIDOf(sb))
			select {}
		}
	}
	fmt.Println("error:", err)
	os.Exit(1)
}

// hostUIDOf is the host uid that root of sb's user namespace is mapped to,
// as the sandbox sees it; 0 when it cannot be read.
func hostUIDOf(sb sandbox.Sandbox) uint32 {
	res, err := sandbox.Run(context0(), sb, sandbox.ExecRequest{File: sandbox.File{Name: "main.sh", Data: []byte("cat /proc/self/uid_map")},
		Argv: []string{"/bin/busybox", "sh", "{file}"}, Env: []string{"PATH=/bin"}, Timeout: 10 * time.Second})
	if err != nil || res.ExitCode != 0 {
		return 0
	}
	// "0 <host> 1" first, then "65534 <host+1> 1".
	f := strings.Fields(string(res.Stdout))
	if len(f) < 6 || f[0] != "0" {
		return 0
	}
	n, _ := strconv.ParseUint(f[1], 10, 32)
	return uint32(n)
}

// TestUserNamespaceRangesDistinct creates as many sandboxes at once as a
// small range has slots, from two driver instances: each gets host ids
// of its own; one more is refused until one is destroyed.
func TestUserNamespaceRangesDistinct(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	const slots = 10
	ids := &hostids.Allocator{Dir: t.TempDir(), First: testFirst, Slots: slots}
	var drivers []*ocidriver.Driver
	for range 2 {
		d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), HostIDs: ids})
		if err != nil {
			t.Fatal(err)
		}
		drivers = append(drivers, d)
	}
	img := testenv.Image(t, "shell")
	sbs := make([]sandbox.Sandbox, slots)
	errs := make([]error, slots)
	var wg sync.WaitGroup
	for i := range slots {
		wg.Go(func() { sbs[i], errs[i] = drivers[i%2].Create(t.Context(), sandbox.Spec{Image: img}) })
	}
	wg.Wait()
	for i, sb := range sbs {
		if errs[i] != nil {
			t.Fatalf("sandbox %d: %v", i, errs[i])
		}
		defer sb.Destroy(t.Context())
	}
	seen := map[uint32]int{}
	for i, sb := range sbs {
		base := hostUIDOf(sb)
		if base < testFirst || base >= testFirst+2*slots {
			t.Fatalf("sandbox %d: root is host uid %d, want one of the range from %d", i, base, testFirst)
		}
		if j, ok := seen[base]; ok {
			t.Errorf("sandboxes %d and %d share host uid %d", j, i, base)
		}
		seen[base] = i
	}
	if _, err := drivers[0].Create(t.Context(), sandbox.Spec{Image: img}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("one more sandbox: got %v, want ErrResourceExhausted", err)
	}
	if err := sbs[3].Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	sb, err := drivers[1].Create(t.Context(), sandbox.Spec{Image: img})
	if err != nil {
		t.Fatalf("after a Destroy: %v", err)
	}
	defer sb.Destroy(t.Context())
}

// TestHostIDsAfterCrash has another process create a sandbox and die
// without destroying it. A new driver on its state directory (a restarted
// daemon) never gives a new sandbox the dead process's ids while its
// bundle exists, also when the record of the slot is lost (it reads the
// bundle's uid map), and gets them once the reaper has destroyed it.
func TestHostIDsAfterCrash(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	state, idDir := t.TempDir(), t.TempDir()
	img := testenv.Image(t, "shell")
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), helperEnv+"="+strings.Join([]string{state, idDir, testenv.Guest(t), img.Rootfs}, ":"))
	out, _ := child.StdoutPipe()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	theirs, err := strconv.ParseUint(strings.TrimSpace(line), 10, 32)
	if err != nil || theirs == 0 {
		child.Process.Kill()
		t.Fatalf("the other process said %q", line)
	}
	child.Process.Kill()
	child.Wait()
	// The record of the slot is lost too: only the bundle says.
	if err := os.Remove(filepath.Join(idDir, line[:len(line)-1])); err != nil {
		t.Fatal(err)
	}
	// So is the record of its creator, by which the new driver's first
	// create would destroy it at once (as it does a killed `stockade
	// run`'s): the bundle stays until Reap, as one of a sandbox whose
	// creator cannot be judged does.
	bundles, err := filepath.Glob(filepath.Join(state, "bundles", "*", "creator"))
	if err != nil || len(bundles) != 1 {
		t.Fatalf("the dead process's creator record: got %v, %v; want one", bundles, err)
	}
	if err := os.Remove(bundles[0]); err != nil {
		t.Fatal(err)
	}

	d, err := runc.New(runc.Config{StateDir: state, GuestPath: testenv.Guest(t), HostIDs: &hostids.Allocator{Dir: idDir, First: testFirst, Slots: 2}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := d.Create(t.Context(), sandbox.Spec{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(t.Context())
	if got := hostUIDOf(sb); got == uint32(theirs) || got == 0 {
		t.Fatalf("a new sandbox got host uid %d; the dead process's sandbox has %d", got, theirs)
	}
	if _, err := d.Create(t.Context(), sandbox.Spec{Image: img}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("before the reaper ran: got %v, want ErrResourceExhausted", err)
	}
	reaped, err := d.Reap(t.Context(), map[string]string{"crashed": "yes"})
	if err != nil || len(reaped) != 1 {
		t.Fatalf("Reap: got %v, %v, want the dead process's sandbox", reaped, err)
	}
	again, err := d.Create(t.Context(), sandbox.Spec{Image: img})
	if err != nil {
		t.Fatalf("after the reaper ran: %v", err)
	}
	defer again.Destroy(t.Context())
	if got := hostUIDOf(again); got != uint32(theirs) {
		t.Errorf("after the reaper ran: got host uid %d, want the freed %d", got, theirs)
	}
}

// context0 is the helper process's context, which has no test.
func context0() context.Context { return context.Background() }
