package wiring_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/wiring"
)

// TestEngineUsesEgressConfig checks that Engine builds the sandbox networks
// from the configured prefix and range: a network a crashed daemon left
// with that prefix is gone once the engine is built.
func TestEngineUsesEgressConfig(t *testing.T) {
	testenv.RequiresRoot(t)
	cfg := config.Default()
	cfg.StateDir, cfg.GuestPath = t.TempDir(), testenv.Guest(t)
	cfg.Egress = true
	cfg.EgressPrefix, cfg.EgressRange = "stko", "10.213.208.0/24"
	nc, err := wiring.NetnsConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	crashed, err := netns.NewManager(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Create(t.Context(), netns.Options{ProxyPorts: []uint16{3128}}); err != nil {
		t.Fatal(err)
	}
	left := crashed.Leftovers()
	if len(left) == 0 {
		t.Fatal("the network was not created")
	}
	defer crashed.CleanupStale()
	e, err := wiring.Engine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !e.EgressAvailable() {
		t.Error("egress is not available after Engine")
	}
	if after := crashed.Leftovers(); len(after) > 0 {
		t.Errorf("Engine left %v (of %v) behind", after, left)
	}
}

// TestEngineWithoutEgressLoadsEgressTools opens an engine that is not asked
// for egress, as the CLI's are, over records with egress and credentials:
// they load (other tools of the same directory stay usable), and running
// the one that needs the broker is refused with what to do. A daemon
// without egress refuses them at start.
func TestEngineWithoutEgressLoadsEgressTools(t *testing.T) {
	testenv.Image(t, "python")
	dir := t.TempDir()
	file := filepath.Join(dir, "tools.yaml")
	if err := os.WriteFile(file, []byte(`tools:
  - name: fetcher
    input_trust: trusted
    tier: gvisor
    egress: {allow: [pypi.org], ports: [443]}
  - name: caller
    input_trust: trusted
    tier: gvisor
    credentials: [issues.create]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.StateDir, cfg.GuestPath, cfg.Tools, cfg.DataDir = t.TempDir(), testenv.Guest(t), file, testenv.DataDir()
	e, err := wiring.Engine(cfg)
	if err != nil {
		t.Fatalf("Engine: %v", err)
	}
	for _, name := range []string{"fetcher", "caller", "code.execute"} {
		if _, err := e.Tools().Get(name); err != nil {
			t.Errorf("tool %s: %v", name, err)
		}
	}
	_, err = e.NewSandbox(t.Context(), engine.Request{Runtime: "python", Tool: "caller"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "only the daemon enables it") {
		t.Errorf("a session of the tool that needs the broker: got %v, want a failed precondition saying what to do", err)
	}
	cfg.Serving = true // and cfg.Egress false: serve --egress=false
	if _, err := wiring.Engine(cfg); err == nil || !strings.Contains(err.Error(), "credentials-unsupported") || !strings.Contains(err.Error(), "egress-unsupported") {
		t.Errorf("Engine of a daemon without egress: got %v, want the egress and credentials records refused", err)
	}
}

// TestModalHalfToken checks that a modal token id without its secret
// leaves the modal driver out when it is not the default driver (the
// daemon starts on runc), and is refused, naming the secret, when it is.
func TestModalHalfToken(t *testing.T) {
	cfg := config.Default()
	cfg.StateDir, cfg.GuestPath = t.TempDir(), testenv.Guest(t)
	cfg.Modal.TokenID = "ak-test"
	cfg.Modal.TokenSecret = "as-test"
	drivers, err := wiring.Drivers(cfg)
	if err != nil || drivers["modal"] == nil {
		t.Fatalf("the control: with both halves: got %v, %v; want a modal driver", drivers, err)
	}
	cfg.Modal.TokenSecret = ""
	cfg.Driver = "runc"
	drivers, err = wiring.Drivers(cfg)
	if err != nil || drivers["runc"] == nil || drivers["modal"] != nil {
		t.Errorf("default runc, no secret: got %v, %v; want runc and no modal", drivers, err)
	}
	cfg.Driver = "modal"
	if _, err := wiring.Drivers(cfg); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "MODAL_TOKEN_SECRET") {
		t.Errorf("default modal, no secret: got %v, want ErrInvalidArgument naming MODAL_TOKEN_SECRET", err)
	}
}

// TestVercelHalfCredentials: a token without its team and project leaves
// the vercel driver out when it is not the default, and refuses the start,
// naming what is missing, when it is.
func TestVercelHalfCredentials(t *testing.T) {
	cfg := config.Default()
	cfg.StateDir, cfg.GuestPath = t.TempDir(), testenv.Guest(t)
	cfg.Vercel = config.Vercel{Token: "t", TeamID: "team", ProjectID: "prj"}
	drivers, err := wiring.Drivers(cfg)
	if err != nil || drivers["vercel"] == nil {
		t.Fatalf("the control: with all three: got %v, %v; want a vercel driver", drivers, err)
	}
	cfg.Vercel.ProjectID, cfg.Driver = "", "runc"
	drivers, err = wiring.Drivers(cfg)
	if err != nil || drivers["runc"] == nil || drivers["vercel"] != nil {
		t.Errorf("default runc, no project: got %v, %v; want runc and no vercel", drivers, err)
	}
	cfg.Driver = "vercel"
	if _, err := wiring.Drivers(cfg); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "VERCEL_PROJECT_ID") {
		t.Errorf("default vercel, no project: got %v, want ErrInvalidArgument naming VERCEL_PROJECT_ID", err)
	}
}
