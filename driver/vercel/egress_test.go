package vercel_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/driver/vercel"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// egressTools are tools on the microvm tier: one with an egress
// allowlist, one without, one that lists a broker operation.
const egressTools = `
tools:
  - name: fetch
    input_trust: trusted
    tier: microvm
    runtimes: [python]
    egress:
      allow: [pypi.org, "*.pythonhosted.org"]
      ports: [443]
  - name: offline
    input_trust: trusted
    tier: microvm
    runtimes: [python]
`

// TestEgress builds an engine over the driver and the fake and checks the
// provider's network policy each sandbox is created with: the record's
// allowlist when the request asks for network, deny-all otherwise, and
// a request for network with no allowlist refused before anything is
// created. A record that lists broker operations does not load for the
// tier.
func TestEgress(t *testing.T) {
	f, base := fakeAPI(t)
	d := newDriver(t, base)
	path := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(path, []byte(egressTools), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := tools.Options{EgressSupported: true, Drivers: map[string]sandbox.Capabilities{"vercel": vercel.Capabilities()}}
	set, err := tools.Load(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(map[string]sandbox.Driver{"vercel": d}, "vercel", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(), engine.WithTools(set, opts))
	if err != nil {
		t.Fatal(err)
	}
	policy := func(tool string, network bool) (string, error) {
		t.Helper()
		sb, err := eng.NewSandbox(t.Context(), engine.Request{Tool: tool, Runtime: "python", Network: network})
		if err != nil {
			return "", err
		}
		defer sb.Destroy(context.WithoutCancel(t.Context()))
		p := f.Policy("stockade-" + sb.ID())
		if p == nil {
			t.Fatalf("the fake has no sandbox stockade-%s", sb.ID())
		}
		var v any
		_ = json.Unmarshal(p, &v)
		b, _ := json.Marshal(v)
		return string(b), nil
	}
	for _, c := range []struct {
		tool    string
		network bool
		want    string
	}{
		{"fetch", true, `{"allow":["pypi.org","*.pythonhosted.org"]}`},
		{"fetch", false, `{"mode":"deny-all"}`},
		{"offline", false, `{"mode":"deny-all"}`},
	} {
		if got, err := policy(c.tool, c.network); err != nil || got != c.want {
			t.Errorf("tool %s, network %v: got policy %s, %v; want %s", c.tool, c.network, got, err, c.want)
		}
	}
	// What a request sends: creates and commands. The health cache's
	// refresh lists sandboxes at any time, and is not counted.
	sent := func() int {
		n := 0
		for _, s := range f.Shapes() {
			if s.Method == "POST" && (s.Route == "/v2/sandboxes" || strings.HasPrefix(s.Route, "/v2/sandboxes/sessions/{session}/cmd")) {
				n++
			}
		}
		return n
	}
	before := sent()
	if before == 0 {
		t.Fatal("the control: the fake saw no create")
	}
	if _, err := policy("offline", true); !errdefs.IsPermissionDenied(err) {
		t.Errorf("network for a tool without an allowlist: got %v, want ErrPermissionDenied", err)
	}
	if sent() != before {
		t.Errorf("the refused request reached the API")
	}

	broker := egressTools + "  - name: brokered\n    input_trust: trusted\n    tier: microvm\n    runtimes: [python]\n    credentials: [github.read]\n"
	if err := os.WriteFile(path, []byte(broker), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = tools.Load(path, opts)
	var ps tools.Problems
	if !errors.As(err, &ps) || !slices.ContainsFunc(ps, func(p tools.Problem) bool { return p.Tool == "brokered" && p.Rule == tools.RuleCredentials }) {
		t.Errorf("a microvm tool with credentials: got %v, want a credentials problem", err)
	}
}
