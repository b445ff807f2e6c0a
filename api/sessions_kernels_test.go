package api_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image/png"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/wire"
)

// salesCSV is a CSV of n rows: region (north, south, east, west in turn)
// and total (the row's number modulo 100).
func salesCSV(n int) []byte {
	var b bytes.Buffer
	b.WriteString("region,total\n")
	regions := []string{"north", "south", "east", "west"}
	for i := range n {
		fmt.Fprintf(&b, "%s,%d\n", regions[i%4], i%100)
	}
	return b.Bytes()
}

// dataFrameFlow is the flow in a python session at base: cell 1
// reads a 100,000-row CSV uploaded through the files API into a
// DataFrame, cell 2 aggregates it and returns the value; between (after
// cell 2) restart is called; cell 3 plots it and returns a PNG of the
// expected size; cell 4 writes a file that is downloaded and compared.
// restart returns the daemon's URL after it.
func dataFrameFlow(t *testing.T, base, key string, restart func() string) {
	t.Helper()
	var ss wire.Session
	do(t, base, "POST", "/v1/sessions", key, capability.CreateSessionRequest{Runtime: "python"}).want(t, http.StatusCreated).decode(t, &ss)
	defer func() { do(t, base, "DELETE", "/v1/sessions/"+ss.ID, key, nil) }()
	cellAt := func(code string) wire.Cell {
		t.Helper()
		var v wire.Cell
		do(t, base, "POST", "/v1/sessions/"+ss.ID+"/exec", key, capability.CellRequest{Code: code, TimeoutMS: 30_000}).want(t, http.StatusOK).decode(t, &v)
		if v.Status != "succeeded" {
			t.Fatalf("cell %q: got %+v", code, v)
		}
		return v
	}
	csv := salesCSV(100_000)
	do(t, base, "PUT", "/v1/sessions/"+ss.ID+"/files?path=sales.csv", key, csv).want(t, http.StatusCreated)
	cellAt("import pandas as pd\ndf = pd.read_csv('sales.csv')\nlen(df)")
	// 25,000 rows per region; totals cycle 0..99 every 100 rows, four
	// regions interleaved: each region sums the same.
	want := 0
	for i := range 100_000 {
		if i%4 == 0 {
			want += i % 100
		}
	}
	v := cellAt("int(df[df.region == 'north'].total.sum())")
	if len(v.Outputs) != 1 || v.Outputs[0].MimeType != "text/plain" || v.Outputs[0].Data != fmt.Sprint(want) {
		t.Fatalf("cell 2: got %+v, want the value %d", v.Outputs, want)
	}
	base = restart()
	v = cellAt("import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(4, 3), dpi=100)\ndf.groupby('region').total.sum().plot.bar()")
	var img []byte
	for _, o := range v.Outputs {
		if o.MimeType == "image/png" {
			b, err := base64.StdEncoding.DecodeString(o.Data)
			if err != nil {
				t.Fatalf("the PNG is not base64: %v", err)
			}
			img = b
		}
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(img))
	if err != nil || cfg.Width != 400 || cfg.Height != 300 {
		t.Fatalf("cell 3's figure: got %dx%d, %v; want a 400x300 PNG", cfg.Width, cfg.Height, err)
	}
	cellAt("df.head(10).to_csv('out.csv', index=False)")
	got := do(t, base, "GET", "/v1/sessions/"+ss.ID+"/files?path=out.csv", key, nil).want(t, http.StatusOK)
	lines := strings.SplitAfter(string(csv), "\n")
	if wantOut := strings.Join(lines[:11], ""); string(got.body) != wantOut {
		t.Fatalf("cell 4's file: got %q, want %q", got.body, wantOut)
	}
}

// TestSessionDataFrame runs the flow through a `stockade serve` on runc,
// killed with SIGKILL between cells 2 and 3 (the DataFrame survives), and
// through a daemon in the test on gVisor.
func TestSessionDataFrame(t *testing.T) {
	requireSandboxes(t)
	t.Run("runc kill-9", func(t *testing.T) {
		bin := testenv.Build(t, "./cmd/stockade")
		dir := t.TempDir()
		key, args := setUpDaemon(t, bin, dir, backends[0].url(t), filepath.Join(dir, "state"))
		d := startDaemon(t, bin, args...)
		dataFrameFlow(t, d.url, key, func() string {
			d.kill()
			d = startDaemon(t, bin, args...)
			return d.url
		})
		d.stop()
	})
	t.Run("gvisor", func(t *testing.T) {
		testenv.RequiresBinary(t, "runsc")
		gv, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
		if err != nil {
			t.Fatal(err)
		}
		e := newEnv(t, backends[0], envConfig{sessions: true, kernels: true, policy: noApproval, credits: 100,
			drivers: map[string]sandbox.Driver{"gvisor": gv}, defaultDriver: "gvisor"})
		dataFrameFlow(t, e.url, e.agent, func() string { return e.url })
	})
}

// TestSessionNodeAndShellState checks that node and shell kernels carry
// their state across cells: a variable of node's persistent context, and
// shell's working directory and variables.
func TestSessionNodeAndShellState(t *testing.T) {
	e := newEnv(t, backends[0], envConfig{sessions: true, kernels: true, policy: noApproval, credits: 100})
	for _, tc := range []struct{ runtime, set, get, want string }{
		{"node", "let x = 41", "x + 1", "42"},
		{"shell", "cd /tmp && export V=7", "echo $V $(pwd)", "7 /tmp\n"},
	} {
		t.Run(tc.runtime, func(t *testing.T) {
			ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: tc.runtime})
			e.cell(e.agent, ss.ID, tc.set)
			c := e.cell(e.agent, ss.ID, tc.get)
			got := c.Stdout
			if len(c.Outputs) > 0 {
				got = c.Outputs[len(c.Outputs)-1].Data
			}
			if got != tc.want {
				t.Fatalf("got %q (%+v), want %q", got, c, tc.want)
			}
		})
	}
}
