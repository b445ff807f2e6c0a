package ocidriver_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/supervisor"
)

// detachedDrivers build each OCI driver with a shim over a state directory.
var detachedDrivers = []struct {
	name, runtime string
	build         func(t testing.TB, state string) (*ocidriver.Driver, error)
}{
	{"runc", "runc", func(t testing.TB, state string) (*ocidriver.Driver, error) {
		return runc.New(runc.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	}},
	{"gvisor", "runsc", func(t testing.TB, state string) (*ocidriver.Driver, error) {
		return gvisor.New(gvisor.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	}},
}

// TestReattachProves checks that Reattach returns only the detached
// sandboxes it can prove are its own and destroys the others: one of
// another owner, one whose record was edited (its labels changed to the
// owner's), one whose record was signed under another key, one whose shim
// is gone; and that Reap leaves the re-attached one alone.
func TestReattachProves(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range detachedDrivers {
		t.Run(drv.name, func(t *testing.T) {
			testenv.RequiresBinary(t, drv.runtime)
			state := t.TempDir()
			d, err := drv.build(t, state)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			img := testenv.Image(t, "shell")
			mine := map[string]string{"owner": "me"}
			create := func(labels map[string]string) string {
				t.Helper()
				sb, err := d.Create(ctx, sandbox.Spec{Image: img, Detached: true, Labels: labels})
				if err != nil {
					t.Fatal(err)
				}
				return sb.ID()
			}
			ours := create(mine)
			other := create(map[string]string{"owner": "someone else"})
			edited := create(map[string]string{"owner": "someone else"})
			foreign := create(mine)
			orphan := create(mine)
			all := []string{ours, other, edited, foreign, orphan}
			t.Cleanup(func() {
				// Whatever the test left is destroyed by the reaper.
				_, _ = d.Reap(context.Background(), nil)
			})

			shims := filepath.Join(state, "shims")
			// edited: its labels rewritten to the owner's, MAC untouched.
			meta := filepath.Join(shims, edited, supervisor.MetaFile)
			b, err := os.ReadFile(meta)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			m["labels"] = map[string]string{"owner": "me"}
			b, _ = json.Marshal(m)
			if err := os.WriteFile(meta, b, 0o600); err != nil {
				t.Fatal(err)
			}
			// foreign: the same record, signed under another key.
			fm, err := supervisor.ReadMeta(filepath.Join(shims, foreign), mustKey(t, shims))
			if err != nil {
				t.Fatal(err)
			}
			if err := supervisor.WriteMeta(filepath.Join(shims, foreign), make([]byte, 32), fm); err != nil {
				t.Fatal(err)
			}
			// orphan: its shim killed.
			if err := supervisor.KillShim(ctx, filepath.Join(shims, orphan)); err != nil {
				t.Fatal(err)
			}

			restarted, err := drv.build(t, state)
			if err != nil {
				t.Fatal(err)
			}
			got, err := restarted.Reattach(ctx, mine)
			if err != nil {
				t.Fatalf("Reattach: %v", err)
			}
			var ids []string
			for _, sb := range got {
				ids = append(ids, sb.ID())
			}
			if !slices.Equal(ids, []string{ours}) {
				t.Fatalf("Reattach returned %v, want only %s", ids, ours)
			}
			for _, id := range all[1:] {
				if left := restarted.Leftovers(id); len(left) > 0 {
					t.Errorf("sandbox %s, not provably ours, left: %s", id, strings.Join(left, "; "))
				}
			}
			if reaped, err := restarted.Reap(ctx, mine); err != nil || len(reaped) != 0 {
				t.Errorf("Reap after Reattach: got %v, %v; want the re-attached sandbox left alone", reaped, err)
			}
			if res, err := sandbox.Run(ctx, got[0], sandbox.ExecRequest{File: sandbox.File{Name: "a.sh", Data: []byte("echo still here")}, Argv: []string{"/bin/sh", "{file}"}}); err != nil || string(res.Stdout) != "still here\n" {
				t.Errorf("the re-attached sandbox: got %+v, %v", res, err)
			}
			if err := got[0].Destroy(ctx); err != nil {
				t.Fatal(err)
			}
			if left := restarted.Leftovers(ours); len(left) > 0 {
				t.Errorf("after Destroy, %s left: %s", ours, strings.Join(left, "; "))
			}
		})
	}
}

func mustKey(t *testing.T, root string) []byte {
	t.Helper()
	key, err := supervisor.LoadKey(root)
	if err != nil {
		t.Fatal(err)
	}
	return key
}
