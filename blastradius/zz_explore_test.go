package blastradius

import (
	"testing"
	"strconv"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/probeexec"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/conformance"
)

func TestZZFork(t *testing.T) {
	d, _ := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	e, _ := engine.New(map[string]sandbox.Driver{"gvisor": d}, "gvisor", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	for _, n := range []int{0, 32, 64, 128, 192} {
		sb, err := e.NewSession(t.Context(), engine.Request{Runtime: "shell"})
		if err != nil { t.Fatal(err) }
		gz, _ := probeexec.Compress(conformance.BuildProbe(t))
		probeexec.Install(t.Context(), sb, gz, probeexec.Busybox)
		res, err := sb.Exec(t.Context(), probeexec.Request(sandbox.ExecRequest{Env: engine.ProgramEnv()}, "pidlimit", strconv.Itoa(n)))
		t.Logf("n=%d err=%v status=%s peak=%d MiB out=%s", n, err, res.Status, res.PeakMemory>>20, res.Stdout)
		sb.Destroy(t.Context())
	}
}
