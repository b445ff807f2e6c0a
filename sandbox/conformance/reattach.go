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
	if left := s.leftovers(theirs.id); len(left) > 0 {
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
