package main

// The checks of lifetime_test.go with the guest as PID 1 of real sandboxes,
// where its fast path (kill(-1) with no kernel) and its /proc sweeps (with
// kernels) run as in production. They need root, the runtimes and the
// shell image (`make setup`), and run under the shared test lock.

import (
	"context"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// guestClienter is the drivers' access to the guest's protocol client,
// until the sandbox contract carries files and kernels.
type guestClienter interface {
	GuestClient() *guest.Client
}

func sandboxEnv(d sandbox.Driver) newEnv {
	return func(t *testing.T) *env {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell"), Labels: map[string]string{"stockade.test": "guest"}})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		t.Cleanup(func() {
			if err := sb.Destroy(context.WithoutCancel(t.Context())); err != nil {
				t.Errorf("Destroy: %v", err)
			}
		})
		c := sb.(guestClienter).GuestClient()
		e := &env{c: c, dir: "/tmp/t", kernel: []string{profile.GuestPath, testKernelMode}}
		if err := c.Mkdir(ctx, e.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return e
	}
}

func TestInRunc(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: guestBin})
	if err != nil {
		t.Fatal(err)
	}
	runChecks(t, sandboxEnv(d))
}

func TestInGVisor(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	d, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: guestBin})
	if err != nil {
		t.Fatal(err)
	}
	runChecks(t, sandboxEnv(d))
}
