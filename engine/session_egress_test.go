package engine

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// sessionFetch is a python cell that fetches the upstream by the allowed
// name, as sessionFetch % port.
const sessionFetch = `
import urllib.request
try:
    print("allowed OK", urllib.request.urlopen("http://allowed.test:%d/x", timeout=5).read().decode())
except Exception as e:
    print("allowed FAILED", type(e).__name__, e)
`

// sessionEgressEngine is one daemon's engine with egress and its sandbox
// networks, over driver name (runc or gvisor, with the shim) whose state is
// in state, with the tools of toolsFile and override's names.
func sessionEgressEngine(t *testing.T, name, state, toolsFile string, override *egress.TestOverride, opts ...Option) (*Engine, *netns.Manager) {
	t.Helper()
	nets, err := netns.NewManager(netns.Config{Prefix: egressTestPrefix, Range: egressTestRange})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nets.CleanupStale(); err != nil {
		t.Fatal(err)
	}
	host, err := NewEgressHost(nets, egress.Config{Resolver: &mapResolver{}, TestOverride: override}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var d sandbox.Driver
	if name == "runc" {
		d, err = runc.New(runc.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	} else {
		d, err = gvisor.New(gvisor.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	}
	if err != nil {
		t.Fatal(err)
	}
	topts := tools.Options{EgressSupported: true, Drivers: DriverCapabilities()}
	set, err := tools.Load(toolsFile, topts)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(map[string]sandbox.Driver{name: d}, name, image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		append([]Option{WithTools(set, topts), WithEgress(host)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return e, nets
}

// TestSessionEgressReattach opens two sessions with network on runc and
// gVisor, then plays a daemon's crash and restart: a new engine, over a
// new network manager of the same prefix whose CleanupStale keeps the
// sessions' networks (also when a driver's Reattach fails), and whose
// tool's record now allows another name, re-attaches the session its
// store knows, whose kernel keeps its state and whose network is served
// again with the allowlist pinned at its open, and destroys
// the other, whose network it removes; the network of the one it serves
// is gone once it is closed.
func TestSessionEgressReattach(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.Image(t, "python")
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "upstream")
	}))
	t.Cleanup(up.Close)
	port := up.Listener.Addr().(*net.TCPAddr).Port
	override := egress.NewTestOverride(t, map[string][]netip.Addr{"allowed.test": {netip.MustParseAddr("127.0.0.1")}})

	for _, name := range []string{"runc", "gvisor"} {
		t.Run(name, func(t *testing.T) {
			testenv.RequiresBinary(t, map[string]string{"runc": "runc", "gvisor": "runsc"}[name])
			tier := map[string]string{"runc": "container", "gvisor": "gvisor"}[name]
			toolsFile := writeTools(t, pythonFetch(tier, []string{"allowed.test"}, port))
			state := t.TempDir()
			owner := map[string]string{LabelOwner: "engine-test-net"}
			daemon := func(toolsFile string) (*Engine, *netns.Manager) {
				return sessionEgressEngine(t, name, state, toolsFile, override)
			}
			e1, nets1 := daemon(toolsFile)
			t.Cleanup(func() {
				if left := nets1.Leftovers(); len(left) > 0 {
					t.Errorf("left behind: %v", left)
					_, _ = nets1.CleanupStale()
					_, _ = nets1.RemoveKept(nil)
				}
			})
			open := func(session string) *Session {
				t.Helper()
				s, err := e1.OpenSession(t.Context(), SessionSpec{Runtime: "python", Tool: "fetch", Network: true, Workspace: 8 << 20,
					Labels: map[string]string{LabelOwner: owner[LabelOwner], LabelSession: session}})
				if err != nil {
					t.Fatalf("OpenSession: %v", err)
				}
				return s
			}
			kept, stray := open("ses_kept"), open("ses_stray")
			if kept.Network() != NetworkAllowlist || kept.net == nil || !strings.Contains(kept.net.Name, "-k") {
				t.Fatalf("a session with network: got %q, net %+v; want the allowlist in a kept network", kept.Network(), kept.net)
			}
			if r := cell(t, kept, "x = 41\n"+fmt.Sprintf(sessionFetch, port), 30*time.Second); !strings.Contains(r.Stdout, "allowed OK upstream") {
				t.Fatalf("before the restart: got stdout %q stderr %q", r.Stdout, r.Stderr)
			}
			keptNet, strayNet := kept.net.Name, stray.net.Name
			if allow, _ := kept.Egress(); !slices.Equal(allow, []string{"allowed.test"}) {
				t.Fatalf("the session's enforced allowlist: got %v, want allowed.test", allow)
			}

			// The crash: the daemon's proxy and responder are gone with
			// it, the sandboxes and their namespaces stay.
			kept.net.Stop()
			stray.net.Stop()
			// The tool's record changes while the daemon is down: the
			// session keeps the allowlist it opened with.
			e2, nets2 := daemon(writeTools(t, pythonFetch(tier, []string{"elsewhere.test"}, port)))
			if left := nets2.Leftovers(); !slices.ContainsFunc(left, func(s string) bool { return strings.HasSuffix(s, " "+keptNet) }) {
				t.Fatalf("after CleanupStale: got %v, want the session's network %s kept", left, keptNet)
			}
			specOf := func(id string) (SessionSpec, bool) {
				return SessionSpec{Runtime: "python", Tool: "fetch", Network: true}, id == kept.SandboxID()
			}
			// A driver whose Reattach fails (its runtime's list) may have
			// live sandboxes still: no network is removed.
			drv := e2.drivers[name]
			e2.drivers[name] = failingReattach{drv}
			if got, err := e2.ReattachSessions(t.Context(), owner, specOf); err == nil || len(got) != 0 {
				t.Fatalf("ReattachSessions over a failing driver: got %d sessions, %v; want its error", len(got), err)
			}
			for _, n := range []string{keptNet, strayNet} {
				if left := nets2.Leftovers(); !slices.ContainsFunc(left, func(s string) bool { return strings.HasSuffix(s, " "+n) }) {
					t.Fatalf("after a failed Reattach: got %v, want the network %s kept", left, n)
				}
			}
			e2.drivers[name] = drv
			got, err := e2.ReattachSessions(t.Context(), owner, specOf)
			if err != nil || len(got) != 1 || got[0].SandboxID() != kept.SandboxID() {
				t.Fatalf("ReattachSessions: got %d sessions, %v; want %s", len(got), err, kept.SandboxID())
			}
			s := got[0]
			r := cell(t, s, "print(x + 1)\n"+fmt.Sprintf(sessionFetch, port), 30*time.Second)
			if !strings.Contains(r.Stdout, "42") || !strings.Contains(r.Stdout, "allowed OK upstream") {
				t.Fatalf("after the restart: got stdout %q stderr %q, want 42 and the upstream", r.Stdout, r.Stderr)
			}
			if n := hits.Load(); n < 2 {
				t.Errorf("the upstream answered %d requests, want 2", n)
			}
			if allow, _ := s.Egress(); !slices.Equal(allow, []string{"allowed.test"}) {
				t.Errorf("the enforced allowlist after the restart: got %v, want the pinned allowed.test", allow)
			}
			left := nets2.Leftovers()
			if slices.ContainsFunc(left, func(s string) bool { return strings.Contains(s, strayNet) }) {
				t.Errorf("after the re-attach: got %v, want the destroyed session's network %s removed", left, strayNet)
			}
			if err := s.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := e2.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			if left := nets2.Leftovers(); len(left) > 0 {
				t.Errorf("after Close: got %v, want no network left", left)
			}
			hits.Store(0)
		})
	}
}

// TestSessionEgressSkipsPool checks that a session with network never
// takes a session pool's sandbox, which has none (no driver gives one at
// bind time: Capabilities.BindEgress), while a session of the same tool
// without network does.
func TestSessionEgressSkipsPool(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	testenv.Image(t, "python")
	if DriverCapabilities()["runc"].BindEgress {
		t.Fatal("runc gives egress at bind time now: a session with network may take a pool's sandbox, and this test must say so")
	}
	override := egress.NewTestOverride(t, map[string][]netip.Addr{"allowed.test": {netip.MustParseAddr("127.0.0.1")}})
	e, nets := sessionEgressEngine(t, "runc", t.TempDir(), writeTools(t, pythonFetch("container", []string{"allowed.test"}, 8080)), override,
		WithPools(PoolOptions{Pools: []PoolSpec{{Tool: "fetch", Runtime: "python", Sessions: 1}}, SessionWorkspace: poolWorkspace}))
	counts := &poolCounts{}
	e.SetPoolObserver(counts)
	stop, err := e.StartPools(context.Background(), map[string]string{LabelOwner: poolOwner})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		_ = e.Wait(context.Background())
		if left := nets.Leftovers(); len(left) > 0 {
			t.Errorf("left behind: %v", left)
			_, _ = nets.RemoveKept(nil)
		}
	})
	waitReady(t, e, 1)
	open := func(network bool) *Session {
		t.Helper()
		s, err := e.OpenSession(t.Context(), SessionSpec{Runtime: "python", Tool: "fetch", Network: network, Workspace: poolWorkspace,
			Labels: map[string]string{LabelOwner: poolOwner, LabelSession: "ses_" + strconv.FormatBool(network)}})
		if err != nil {
			t.Fatalf("OpenSession(network %v): %v", network, err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	if s := open(true); s.Network() != NetworkAllowlist {
		t.Fatalf("a session with network: got %q", s.Network())
	}
	if hits, _ := counts.get(); hits != 0 {
		t.Fatalf("a session with network took a pool's sandbox (%d hits)", hits)
	}
	if s := open(false); s.Network() != NetworkNone {
		t.Fatalf("a session without network: got %q", s.Network())
	}
	if hits, _ := counts.get(); hits != 1 {
		t.Fatalf("a session without network: got %d pool hits, want 1", hits)
	}
}

// BenchmarkSessionOpenNetwork opens and closes a session on runc without
// and with network, side by side: what the session's network namespace,
// proxy and DNS responder add to its opening (their removal is in the
// background, waited for outside the timing).
//
//	go test -run '^$' -bench BenchmarkSessionOpenNetwork -benchtime=3x ./engine/
func BenchmarkSessionOpenNetwork(b *testing.B) {
	testenv.RequiresRoot(b)
	testenv.Image(b, "shell")
	nets, err := netns.NewManager(netns.Config{Prefix: egressTestPrefix, Range: egressTestRange})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := nets.CleanupStale(); err != nil {
		b.Fatal(err)
	}
	host, err := NewEgressHost(nets, egress.Config{Resolver: &mapResolver{}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	d, err := runc.New(runc.Config{StateDir: b.TempDir(), GuestPath: testenv.Guest(b), Shim: testenv.Shim(b)})
	if err != nil {
		b.Fatal(err)
	}
	topts := tools.Options{EgressSupported: true, Drivers: DriverCapabilities()}
	set, err := tools.Load(writeTools(b, `
tools:
  - name: fetch
    input_trust: trusted
    tier: container
    runtimes: [shell]
    egress:
      allow: [allowed.test]
      ports: [443]
`), topts)
	if err != nil {
		b.Fatal(err)
	}
	e, err := New(map[string]sandbox.Driver{"runc": d}, "runc", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		WithTools(set, topts), WithEgress(host), WithTestKernel())
	if err != nil {
		b.Fatal(err)
	}
	for _, network := range []bool{false, true} {
		b.Run("network="+strconv.FormatBool(network), func(b *testing.B) {
			for b.Loop() {
				s, err := e.OpenSession(b.Context(), SessionSpec{Runtime: "shell", Tool: "fetch", Network: network, Workspace: 8 << 20,
					Labels: map[string]string{LabelOwner: "engine-bench", LabelSession: "ses_bench"}})
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Close(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	if err := e.Wait(context.Background()); err != nil {
		b.Fatal(err)
	}
	if left := nets.Leftovers(); len(left) > 0 {
		b.Errorf("left behind: %v", left)
	}
}

// failingReattach is a driver whose Reattach fails as a runtime's list
// may.
type failingReattach struct{ sandbox.Driver }

func (failingReattach) Reattach(context.Context, map[string]string) ([]sandbox.Sandbox, error) {
	return nil, fmt.Errorf("listing the sandboxes: the runtime timed out")
}
