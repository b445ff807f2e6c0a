package ocidriver_test

import (
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestOneShotEndsItself checks that a one-shot sandbox's runtime process
// ends by itself once its Exec has ended, before Destroy, and that a
// sandbox that is not one-shot keeps running until Destroy.
func TestOneShotEndsItself(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range drivers {
		for _, tt := range []struct {
			name    string
			oneShot bool
		}{{"one-shot", true}, {"serving", false}} {
			t.Run(drv.name+"/"+tt.name, func(t *testing.T) {
				testenv.RequiresBinary(t, drv.runtime)
				d, err := drv.build(t, "", testenv.Guest(t))
				if err != nil {
					t.Fatal(err)
				}
				sb, err := d.Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "python"), OneShot: tt.oneShot})
				if err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := sb.Destroy(t.Context()); err != nil {
						t.Errorf("Destroy: %v", err)
					}
					if left := d.Leftovers(sb.ID()); len(left) > 0 {
						t.Errorf("after Destroy: got leftovers %v, want none", left)
					}
				}()
				res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{
					File: sandbox.File{Name: "main.py", Data: []byte("print(1)")},
					Argv: []string{"/usr/bin/python3", "{file}"},
				})
				if err != nil || string(res.Stdout) != "1\n" {
					t.Fatalf("Exec: got %+v, %v; want stdout 1", res, err)
				}
				// The runtime's process names the sandbox's ID.
				deadline := time.Now().Add(3 * time.Second)
				running := sandboxkit.ProcessesMentioning(sb.ID())
				for len(running) > 0 && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
					running = sandboxkit.ProcessesMentioning(sb.ID())
				}
				if ended := len(running) == 0; ended != tt.oneShot {
					t.Errorf("3 s after the Exec, before Destroy: got the runtime ended %t (%v), want %t", ended, running, tt.oneShot)
				}
			})
		}
	}
}
