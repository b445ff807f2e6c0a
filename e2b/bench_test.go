package e2b_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"testing"

	"github.com/stockade-sh/stockade/internal/testenv"
)

// benchSide is one side's figures of bench.js, in milliseconds.
type benchSide struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
}

// benchPair is the SDK's side and Stockade's own API's side of one
// measure.
type benchPair struct {
	SDK   benchSide `json:"sdk"`
	API   benchSide `json:"api"`
	Ratio float64   `json:"ratio"`
}

// BenchmarkE2BSDK times, side by side in one run, runCode('1') through the
// stock code interpreter SDK against Stockade's E2B wire vs a cell through
// Stockade's session exec API, and the SDK's create-to-first-result vs a
// session create + exec (e2b/testdata/node/bench.js), on the driver of
// STOCKADE_E2B_BENCH_DRIVER (default gvisor):
//
//	go test -run '^$' -bench BenchmarkE2BSDK -benchtime=1x ./e2b/
func BenchmarkE2BSDK(b *testing.B) {
	node := requireSDKs(b)
	testenv.RequiresRoot(b)
	driver := os.Getenv("STOCKADE_E2B_BENCH_DRIVER")
	if driver == "" {
		driver = "gvisor"
	}
	d := startE2BDaemon(b, testenv.Build(b, "./cmd/stockade"), driver, e2bData{})
	for i := 0; i < b.N; i++ {
		cmd := exec.CommandContext(b.Context(), node, "bench.js")
		cmd.Dir = nodeDir
		cmd.Env = suiteEnv(map[string]string{
			"E2B_API_URL":     d.e2bURL,
			"E2B_SANDBOX_URL": d.e2bURL,
			"E2B_API_KEY":     d.agent,
			"STOCKADE_URL":    d.url,
		})
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("node bench.js: %v\n%s", err, stderr.String())
		}
		var got struct{ Runcode, Create benchPair }
		if err := json.Unmarshal(out, &got); err != nil {
			b.Fatalf("decoding %q: %v", out, err)
		}
		b.ReportMetric(got.Runcode.SDK.Median, "sdk-runcode-ms")
		b.ReportMetric(got.Runcode.API.Median, "api-exec-ms")
		b.ReportMetric(got.Runcode.Ratio, "runcode-ratio")
		b.ReportMetric(got.Create.SDK.Median, "sdk-create-first-ms")
		b.ReportMetric(got.Create.API.Median, "api-create-exec-ms")
		b.ReportMetric(got.Create.Ratio, "create-ratio")
		b.Logf("%s: runCode('1') median %.1f ms p90 %.1f (n %d) vs session exec median %.1f ms p90 %.1f: %.2fx; create+first result median %.0f ms vs session create+exec %.0f ms: %.2fx",
			driver, got.Runcode.SDK.Median, got.Runcode.SDK.P90, got.Runcode.SDK.N, got.Runcode.API.Median, got.Runcode.API.P90, got.Runcode.Ratio,
			got.Create.SDK.Median, got.Create.API.Median, got.Create.Ratio)
	}
}
