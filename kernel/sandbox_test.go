package kernel_test

// The kernels run in real runc and gVisor sandboxes, through the guest's
// client, as a session will run them. They need root, the runtimes and the
// images (`stockade setup`), and run under the shared test lock.

import (
	"context"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/kernel"
	"github.com/stockade-sh/stockade/sandbox"
)

// tiers are the drivers the kernels are tested in.
var tiers = []string{"runc", "gvisor"}

// guestClienter is the drivers' access to the guest's protocol client,
// until the sandbox contract carries kernels.
type guestClienter interface {
	GuestClient() *guest.Client
}

func newDriver(t testing.TB, tier string) sandbox.Driver {
	t.Helper()
	testenv.RequiresRoot(t)
	var (
		d   sandbox.Driver
		err error
	)
	switch tier {
	case "runc":
		testenv.RequiresBinary(t, "runc")
		d, err = runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	case "gvisor":
		testenv.RequiresBinary(t, "runsc")
		d, err = gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	default:
		t.Fatalf("no tier %q", tier)
	}
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// newSandbox creates a sandbox of the image of runtime img, destroyed at
// the end of t, and returns its guest's client. The image must be of the
// runtime's current definition (the python image's matplotlib, say).
func newSandbox(t testing.TB, d sandbox.Driver, img string) *guest.Client {
	t.Helper()
	if _, err := image.Open(testenv.DataDir()).Current(img); err != nil {
		testenv.Missing(t, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, img), Labels: map[string]string{"stockade.test": "kernel"}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return sb.(guestClienter).GuestClient()
}

// startKernel starts the kernel name in a new sandbox of image img.
func startKernel(t testing.TB, d sandbox.Driver, name, img string) (*guest.Client, *guest.Kernel) {
	t.Helper()
	c := newSandbox(t, d, img)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := kernel.Start(ctx, c, name, kernel.Options{Image: img})
	if err != nil {
		t.Fatalf("starting the %s kernel: %v", name, err)
	}
	return c, k
}
