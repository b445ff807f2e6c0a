package modal_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stockade-sh/stockade/driver/modal"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestCreateLost checks that a create whose answer is lost (an error
// after the service created the sandbox, or the caller's context ending
// while it waits) terminates the sandbox, found by its name, and that a
// refusal looks for nothing.
func TestCreateLost(t *testing.T) {
	var (
		mu           sync.Mutex
		cancelCaller context.CancelFunc
		fail         error
	)
	f := fakeWith(t, map[string]func(context.Context) error{"SandboxCreate": func(ctx context.Context) error {
		mu.Lock()
		cancel, err := cancelCaller, fail
		mu.Unlock()
		if cancel != nil {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		}
		return err
	}})
	d := newDriver(t, f.URL())
	spec := sandbox.Spec{Image: testenv.Image(t, "shell"), Labels: map[string]string{"owner": "x"}}

	// The control: a create whose answer arrives leaves the sandbox running.
	sb, err := d.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if left := f.Running(); len(left) != 1 {
		t.Fatalf("the control: running after a create: %v, want one", left)
	}
	if err := sb.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name    string
		fail    error
		cancel  bool
		class   error
		running int
	}{
		{"unavailable", status.Error(codes.Unavailable, "connection reset"), false, errdefs.ErrUnavailable, 0},
		{"deadline", status.Error(codes.DeadlineExceeded, "deadline"), false, errdefs.ErrUnavailable, 0},
		{"caller ended", nil, true, context.Canceled, 0},
		// Last: the refused create's sandbox stays, for the fake's Close.
		{"refused", status.Error(codes.InvalidArgument, "no"), false, errdefs.ErrInvalidArgument, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			mu.Lock()
			fail, cancelCaller = c.fail, nil
			if c.cancel {
				cancelCaller = cancel
			}
			mu.Unlock()
			n := len(f.Calls())
			_, err := d.Create(ctx, spec)
			if err == nil || !errors.Is(err, c.class) || (c.cancel && errdefs.IsUnavailable(err)) {
				t.Errorf("Create: got %v, want %v (only)", err, c.class)
			}
			if got := f.Running(); len(got) != c.running {
				t.Errorf("running after the lost create: %v, want %d", got, c.running)
			}
			calls := f.Calls()[n:]
			if looked := slices.Contains(calls, "SandboxList"); looked == (c.running > 0) {
				t.Errorf("calls %v: a SandboxList is %v, want %v", calls, looked, c.running == 0)
			}
		})
	}
}

// TestReapUntagged checks that Reap finds a sandbox of the driver's that
// was never tagged (its Create lost before tagging it), once it is older
// than the call timeout, and leaves a newer one, which another daemon may
// be tagging.
func TestReapUntagged(t *testing.T) {
	f := fakeAPI(t)
	d := newDriver(t, f.URL())
	untagged, err := d.Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	defer untagged.Destroy(context.WithoutCancel(t.Context()))
	other, err := d.Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "shell"), Labels: map[string]string{"owner": "other"}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Destroy(context.WithoutCancel(t.Context()))
	match := map[string]string{"owner": "me"}
	if reaped, err := d.Reap(t.Context(), match); err != nil || len(reaped) != 0 {
		t.Fatalf("Reap of new sandboxes: got %v, %v; want none", reaped, err)
	}
	f.Age(2 * modal.DefaultCallTimeout)
	reaped, err := d.Reap(t.Context(), match)
	if err != nil || !slices.Equal(reaped, []string{untagged.ID()}) {
		t.Fatalf("Reap: got %v, %v; want [%s]", reaped, err, untagged.ID())
	}
	if left := f.Running(); len(left) != 1 {
		t.Errorf("running after Reap: %v, want the other owner's", left)
	}
}

// TestRouterConns checks that the connection to a command router stays
// open while a sandbox that used it lives and is closed with the last
// one's Destroy.
func TestRouterConns(t *testing.T) {
	f := fakeAPI(t)
	d := newDriver(t, f.URL())
	var sbs []sandbox.Sandbox
	for range 2 {
		sb, err := d.Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "shell")})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy(context.WithoutCancel(t.Context()))
		res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{Argv: []string{"/bin/true"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("run: %+v, %v", res, err)
		}
		sbs = append(sbs, sb)
	}
	if n := modal.RouterConns(d); n != 1 {
		t.Fatalf("the control: %d router connections with two sandboxes on the fake's router, want 1", n)
	}
	if err := sbs[0].Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := modal.RouterConns(d); n != 1 {
		t.Errorf("%d router connections while one sandbox lives, want 1", n)
	}
	if err := sbs[1].Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := modal.RouterConns(d); n != 0 {
		t.Errorf("%d router connections after the last Destroy, want 0", n)
	}
}
