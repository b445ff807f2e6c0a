package gvisor_test

import (
	"testing"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox/conformance"
)

func TestConformance(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	d, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	conformance.Run(t, conformance.Harness{Driver: d, Image: testenv.Image(t, "shell"), Leftovers: d.Leftovers})
}
