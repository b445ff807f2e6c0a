package netns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// sandboxScript runs inside the sandbox as python3 -c SCRIPT PORT HOSTADDR.
// Every address it tries is the host end of its own veth, or a name that
// only the sandbox's DNS responder answers.
const sandboxScript = `
import os, socket, sys, urllib.request
port, host = int(sys.argv[1]), sys.argv[2]
def attempt(label, f):
    try:
        print(label, "OK", f())
    except Exception as e:
        print(label, "FAILED", type(e).__name__)
attempt("dns-allowed", lambda: socket.gethostbyname("api.allowed.test"))
attempt("dns-other", lambda: socket.gethostbyname("evil.test"))
attempt("dns-random", lambda: socket.gethostbyname(os.urandom(6).hex() + ".example.com"))
attempt("http-allowed", lambda: urllib.request.urlopen("http://api.allowed.test:%d/x" % port, timeout=5).read().decode())
attempt("broker", lambda: urllib.request.urlopen("http://broker.stockade.internal/v1/ops/echo", timeout=5).read().decode())
def tcp(p):
    s = socket.socket(); s.settimeout(1); s.connect((host, p)); s.close(); return "connected"
attempt("tcp-direct-ip-other-port", lambda: tcp(9999))
def udp(p):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1); s.sendto(b"x", (host, p)); return s.recv(64)
attempt("udp-other-port", lambda: udp(443))
def v6():
    s = socket.socket(socket.AF_INET6); s.settimeout(1); s.connect(("fe80::1%eth0", port)); return "connected"
attempt("ipv6", v6)
print("env", sorted(os.environ.items()))
print("uid_map", " ".join(open("/proc/self/uid_map").read().split()))
`

// TestRuntimesJoinNamespace runs real sandboxes, runc and runsc with
// --network=sandbox, in a prepared namespace given to them by path, behind
// the egress proxy, the DNS responder and a broker stand-in, and checks
// what the code inside could and could not reach. runc runs twice: in the
// host's user namespace, and in a user namespace of the sandbox's own that
// owns the network namespace (as the runc driver's sandboxes do).
func TestRuntimesJoinNamespace(t *testing.T) {
	m := newTestManager(t)
	img := testenv.Image(t, "python")
	const secret = "s3cr3t-broker-credential-0123"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "upstream saw %s%s", r.Host, r.URL.Path)
	}))
	defer up.Close()
	upPort := up.Listener.Addr().(*net.TCPAddr).Port
	// The broker stand-in holds a secret and never returns it; the real
	// broker is tested in package broker.
	brokerH := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = secret
		fmt.Fprintf(w, "broker did %s", r.URL.Path)
	})

	for _, rt := range []struct {
		name   string
		args   []string
		k      oci.Kernel
		userNS bool
	}{
		{"runc", []string{"runc"}, oci.HostKernel, false},
		{"runc-userns", []string{"runc"}, oci.HostKernel, true},
		{"runsc", []string{"runsc", "--platform=systrap", "--network=sandbox", "--oci-seccomp", "--overlay2=none", "--host-uds=none"}, oci.UserSpaceKernel, false},
	} {
		t.Run(rt.name, func(t *testing.T) {
			bin := testenv.RequiresBinary(t, rt.args[0])
			var mu sync.Mutex
			var refused []egress.Decision
			rec := func(d egress.Decision) {
				if !d.Allowed {
					mu.Lock()
					refused = append(refused, d)
					mu.Unlock()
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			n := openEgress(t, ctx, m, rec, upPort, brokerH, rt.userNS)

			dir := t.TempDir()
			resolv := filepath.Join(dir, "resolv.conf")
			if err := os.WriteFile(resolv, n.ResolvConf, 0o644); err != nil {
				t.Fatal(err)
			}
			var b [6]byte
			_, _ = rand.Read(b[:])
			id := "netns-test-" + hex.EncodeToString(b[:])
			// The sandbox joins the prepared namespaces by path and sees the
			// responder in resolv.conf.
			s, err := oci.Build(oci.Options{ID: id, Spec: sandbox.Spec{Image: img, Network: sandbox.NetworkEgress}, Limits: sandbox.DefaultLimits(),
				GuestPath: "/bin/true", CgroupsPath: "/stockade/" + id, Kernel: rt.k,
				NetNSPath: n.Path, ResolvConf: resolv, HostUIDBase: n.HostUIDBase, UserNSPath: n.UserNSPath})
			if err != nil {
				t.Fatal(err)
			}
			s.Process.Args = []string{"/usr/bin/python3", "-c", sandboxScript, fmt.Sprint(upPort), n.HostAddr.String()}
			s.Process.Env = []string{"PATH=/usr/bin:/bin"}
			bundle := filepath.Join(dir, "bundle")
			if err := oci.WriteBundle(bundle, s); err != nil {
				t.Fatal(err)
			}
			state := filepath.Join(dir, "state")
			args := append([]string{"--root", state}, rt.args[1:]...)
			cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
			defer ccancel()
			out, err := exec.CommandContext(cctx, bin, append(args, "run", "--bundle", bundle, id)...).CombinedOutput()
			_ = exec.Command(bin, "--root", state, "delete", "--force", id).Run()
			if err != nil {
				t.Fatalf("%s run: %v\n%s", rt.name, err, out)
			}
			got := string(out)
			for _, want := range []string{
				"dns-allowed OK " + n.HostAddr.String(),
				"dns-other FAILED",
				"dns-random FAILED",
				fmt.Sprintf("http-allowed OK upstream saw api.allowed.test:%d/x", upPort),
				"broker OK broker did /v1/ops/echo",
				"tcp-direct-ip-other-port FAILED",
				"udp-other-port FAILED",
				"ipv6 FAILED",
			} {
				if !strings.Contains(got, want) {
					t.Errorf("sandbox output lacks %q:\n%s", want, got)
				}
			}
			if rt.userNS {
				// Root and the sandbox user, and nothing else.
				want := fmt.Sprintf("uid_map 0 %d 1 65534 %d 1\n", n.HostUIDBase, n.HostUIDBase+1)
				if n.UserNSPath == "" || !strings.Contains(got, want) {
					t.Errorf("user namespace %q: sandbox output lacks %q:\n%s", n.UserNSPath, want, got)
				}
			}
			if strings.Contains(got, secret) {
				t.Errorf("the secret reached the sandbox's output:\n%s", got)
			}
			mu.Lock()
			defer mu.Unlock()
			var dnsRefusals int
			for _, d := range refused {
				if d.Protocol == egress.ProtoDNS && d.Reason == egress.ReasonNameNotAllowed {
					dnsRefusals++
				}
			}
			if dnsRefusals < 2 {
				t.Errorf("refusals %+v, want the DNS refusals of evil.test and the random label", refused)
			}
		})
	}
}

// openEgress prepares a sandbox network whose policy allows
// api.allowed.test (a loopback upstream, through the test override) on
// upPort, and the broker.
func openEgress(t *testing.T, ctx context.Context, m *Manager, rec func(egress.Decision), upPort int, broker http.Handler, userNS bool) *Egress {
	t.Helper()
	p, err := egress.New(egress.Config{
		Resolver:     failResolver{},
		TestOverride: egress.NewTestOverride(t, map[string][]netip.Addr{"api.allowed.test": {netip.MustParseAddr("127.0.0.1")}}),
		OnDecision:   rec,
	})
	if err != nil {
		t.Fatal(err)
	}
	e, err := m.OpenEgress(ctx, p, egress.Policy{Sandbox: "sbx-netns-test", Tool: "netns-test", Allow: []string{"api.allowed.test"}, Ports: []int{upPort}, Broker: broker}, userNS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}
