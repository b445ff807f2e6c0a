package conformance

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// reattach checks that a detached sandbox outlives the driver value that
// created it: a new driver value over the same state (Harness.Restart, as
// a restarted daemon builds) re-attaches it with its kernel's state, and
// destroys a detached sandbox whose labels are not its owner's. A driver
// that cannot must refuse a detached sandbox.
func (s *suite) reattach(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if !s.caps.Reattach {
		sb, err := s.h.Driver.Create(ctx, sandbox.Spec{Image: s.h.Image, Detached: true})
		if err == nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
			t.Fatalf("the driver lacks Reattach (%s), yet created a detached sandbox", s.caps.Lacks["Reattach"])
		}
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("a detached sandbox: got %v, want ErrInvalidArgument (sandbox.Spec.Detached)", err)
		}
		return
	}
	if s.h.Restart == nil {
		t.Fatal("the driver declares Reattach: the harness needs Restart")
	}
	owner := map[string]string{"stockade.test": "reattach", "owner": randHex(4)}
	mine := s.detached(t, ctx, owner)
	theirs := s.detached(t, ctx, map[string]string{"stockade.test": "reattach", "owner": "another-" + randHex(4)})
	k := mine.box.startKernel(t)
	cell(t, k, "set kept "+owner["owner"])
	if got := mine.box.sh(t, "echo before > /tmp/before; cat /tmp/before"); got != "before\n" {
		t.Fatalf("before the restart: got %q", got)
	}

	d2 := s.h.Restart()
	found, err := d2.(sandbox.Reattacher).Reattach(ctx, owner)
	if err != nil {
		t.Fatalf("Reattach: %v", err)
	}
	var again sandbox.Sandbox
	for _, sb := range found {
		if sb.ID() == mine.id {
			again = sb
		} else {
			t.Errorf("Reattach returned sandbox %s, which it was not asked for", sb.ID())
			_ = sb.Destroy(context.WithoutCancel(ctx))
		}
	}
	if again == nil {
		t.Fatalf("Reattach did not return sandbox %s", mine.id)
	}
	mine.set(again)
	// The other owner's sandbox is gone, and nothing of it is left.
	theirs.set(nil)
	if left := s.leftovers(t.Context(), theirs.id); len(left) > 0 {
		t.Errorf("the other owner's sandbox %s, which Reattach should have destroyed, left: %s", theirs.id, strings.Join(left, "; "))
	}

	kernels, err := again.(sandbox.Kernels).ListKernels(ctx)
	if err != nil || len(kernels) != 1 {
		t.Fatalf("the re-attached sandbox's kernels: got %v, %v; want the one started before", kernels, err)
	}
	if got := cell(t, kernels[0], "get kept"); string(got.Stdout) != owner["owner"]+"\n" {
		t.Errorf("the kernel after the re-attach: got %q, want %q", got.Stdout, owner["owner"])
	}
	if got := mine.box.sh(t, "cat /tmp/before"); got != "before\n" {
		t.Errorf("the re-attached sandbox's /tmp: got %q, want what was written before", got)
	}
}

// detachedBox is a detached sandbox of a check, whichever handle of it is
// current; the last one is destroyed when the check ends.
type detachedBox struct {
	id  string
	box *box
}

// set makes sb the handle destroyed at the end (nil: none, someone else
// destroyed it).
func (b *detachedBox) set(sb sandbox.Sandbox) { b.box.sb = sb }

// detached creates a detached sandbox with labels and registers the
// destruction of its current handle.
func (s *suite) detached(t *testing.T, ctx context.Context, labels map[string]string) *detachedBox {
	t.Helper()
	sb, err := s.h.Driver.Create(ctx, sandbox.Spec{Image: s.h.Image, Detached: true, Labels: labels})
	if err != nil {
		t.Fatalf("Create detached: %v", err)
	}
	b := &detachedBox{id: sb.ID(), box: &box{s: s, sb: sb}}
	t.Cleanup(func() {
		if b.box.sb != nil {
			b.box.destroy(t)
		}
	})
	return b
}

// deadline checks that a detached sandbox ends by itself at its deadline
// (sandbox.Spec.Deadline, moved by sandbox.Deadliner) while its creator
// does nothing: a program that runs in it then ends, and it starts no
// other. A deadline moved later keeps it. A driver without Reattach has
// no detached sandboxes (see reattach).
func (s *suite) deadline(t *testing.T) {
	if !s.caps.Reattach {
		t.Logf("driver %s keeps no sandbox beyond its creator: %s", s.h.Driver.Name(), s.caps.Lacks["Reattach"])
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	create := func(deadline time.Time) (*box, sandbox.Deadliner) {
		t.Helper()
		sb, err := s.h.Driver.Create(ctx, sandbox.Spec{Image: s.h.Image, Detached: true, Deadline: deadline,
			Labels: map[string]string{"stockade.test": "deadline"}})
		if err != nil {
			t.Fatalf("Create detached: %v", err)
		}
		b := &box{s: s, sb: sb}
		t.Cleanup(func() { b.destroy(t) })
		dl, ok := sb.(sandbox.Deadliner)
		if !ok {
			t.Fatalf("the detached sandbox of a driver with Reattach does not implement sandbox.Deadliner")
		}
		return b, dl
	}
	// A sandbox's deadline leaves room for its creation, under load.
	kept, dl := create(time.Now().Add(time.Hour))
	for _, d := range []time.Duration{2 * time.Second, time.Hour} {
		if err := dl.SetDeadline(ctx, time.Now().Add(d)); err != nil {
			t.Fatalf("SetDeadline: %v", err)
		}
	}
	moved, dl := create(time.Now().Add(time.Hour))
	movedTo := time.Now().Add(5 * time.Second)
	if err := dl.SetDeadline(ctx, movedTo); err != nil {
		t.Fatalf("SetDeadline: %v", err)
	}
	createdWith := time.Now().Add(10 * time.Second)
	ends, _ := create(createdWith)
	cases := []struct {
		name     string
		b        *box
		deadline time.Time
		ex       sandbox.Exec
	}{{name: "moved to a deadline", b: moved, deadline: movedTo}, {name: "created with a deadline", b: ends, deadline: createdWith}}
	for i, c := range cases {
		ex, err := c.b.sb.Start(ctx, sh("sleep 600"))
		if err != nil {
			t.Fatalf("%s: before the deadline: %v", c.name, err)
		}
		cases[i].ex = ex
	}
	for _, c := range cases {
		wctx, wcancel := context.WithTimeout(ctx, time.Until(c.deadline)+time.Minute)
		res, err := c.ex.Wait(wctx)
		late := wctx.Err() != nil
		wcancel()
		switch {
		case late:
			t.Fatalf("%s: a program in the sandbox still runs a minute past its deadline", c.name)
		case time.Now().Before(c.deadline):
			t.Errorf("%s: the program ended before the deadline (%+v, %v)", c.name, res, err)
		case err == nil && res.Status != sandbox.StatusKilled:
			t.Errorf("%s: the program ended %s, not by the end of its sandbox", c.name, res.Status)
		}
		if _, err := c.b.sb.Start(ctx, sh("true")); err == nil {
			t.Errorf("%s: the sandbox started a program after its deadline", c.name)
		}
	}
	if got := kept.sh(t, "echo kept"); got != "kept\n" {
		t.Errorf("a sandbox whose deadline was moved later, past its first one: got %q", got)
	}
}
