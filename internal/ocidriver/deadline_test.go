package ocidriver_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/supervisor"
)

// runtimeStateOf lists the runtime's state of sandbox id under the
// driver's state directory: runc's directory, runsc's files and socket.
func runtimeStateOf(t *testing.T, state, id string) []string {
	t.Helper()
	var out []string
	for _, pattern := range []string{id, id + "_sandbox:*", "runsc-" + id + ".sock"} {
		m, err := filepath.Glob(filepath.Join(state, "state", pattern))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	return out
}

// TestDeadlineEndsDetached checks that a detached sandbox ends by itself
// at its deadline, given at create (sandbox.Spec.Deadline) or moved later
// (sandbox.Deadliner), with no call of its creator: its shim ends, and
// with it the runtime's container and state.
func TestDeadlineEndsDetached(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range detachedDrivers {
		for _, tt := range []struct {
			name string
			// create is the Spec's deadline, move SetDeadline's (none when
			// zero); both from now.
			create, move time.Duration
		}{
			{"created with it", 3 * time.Second, 0},
			{"moved", time.Hour, 3 * time.Second},
		} {
			t.Run(drv.name+"/"+tt.name, func(t *testing.T) {
				testenv.RequiresBinary(t, drv.runtime)
				state := t.TempDir()
				d, err := drv.build(t, state)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
				defer cancel()
				want := time.Now().Add(tt.create)
				sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell"), Detached: true, Deadline: want})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					_ = sb.Destroy(context.Background())
					if left := d.Leftovers(t.Context(), sb.ID()); len(left) > 0 {
						t.Errorf("left after Destroy: %v", left)
					}
				})
				if tt.move != 0 {
					want = time.Now().Add(tt.move)
					if err := sb.(sandbox.Deadliner).SetDeadline(ctx, want); err != nil {
						t.Fatal(err)
					}
				}
				dir := filepath.Join(state, "shims", sb.ID())
				m, err := supervisor.ReadMeta(dir, mustKey(t, filepath.Join(state, "shims")))
				if err != nil {
					t.Fatal(err)
				}
				if !m.Deadline.Equal(want) {
					t.Errorf("the shim's record: got deadline %v, want %v", m.Deadline, want)
				}
				if len(runtimeStateOf(t, state, sb.ID())) == 0 {
					t.Fatal("before the deadline: the runtime has no state of the sandbox")
				}
				for bound := time.Now().Add(time.Until(want) + 60*time.Second); ; time.Sleep(100 * time.Millisecond) {
					_, running := supervisor.Running(dir)
					left := runtimeStateOf(t, state, sb.ID())
					if !running && len(left) == 0 {
						break
					}
					if time.Now().After(bound) {
						t.Fatalf("60 s past the deadline: shim running %v, runtime state %v; the shim's log:\n%s", running, left, supervisor.Log(dir))
					}
				}
				if x, ok := supervisor.ReadExit(dir); !ok || x.Ended != supervisor.EndedDeadline || x.At.Before(want) {
					t.Errorf("the shim's exit: got %+v (recorded %v), want ended %q after %v", x, ok, supervisor.EndedDeadline, want)
				}
			})
		}
	}
}
