package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// secretPrefix starts every secret of these tests. The sandbox scans for
// it, written split in two so that the code file itself does not hold it.
const secretPrefix = "stk-secret-"

// brokerScript runs in the sandbox: it calls the broker's echo operation
// and an operation its tool does not list, then looks for any secret in
// its environment and every readable file.
const brokerScript = `
import os, urllib.request, urllib.error
def call(label, url):
    try:
        r = urllib.request.urlopen(url, timeout=10)
        print(label, r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print(label, e.code, e.read().decode())
    except Exception as e:
        print(label, "FAILED", type(e).__name__)
call("echo", "http://broker.stockade.internal/v1/ops/echo?msg=hello")
call("other", "http://broker.stockade.internal/v1/ops/other?msg=hello")
marker = ("stk-" + "secret-").encode()
hits, files = [], 0
if marker in b"\0".join(k.encode() + b"=" + v.encode() for k, v in os.environ.items()):
    hits.append("os.environ")
for path in ["/proc/self/environ", "/proc/self/cmdline", "/proc/1/environ", "/proc/1/cmdline"]:
    try:
        if marker in open(path, "rb").read():
            hits.append(path)
    except OSError:
        pass
for root, dirs, names in os.walk("/"):
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for n in names:
        p = os.path.join(root, n)
        try:
            if not os.path.isfile(p) or os.path.islink(p) or os.path.getsize(p) > (4 << 20):
                continue
            files += 1
            if marker in open(p, "rb").read():
                hits.append(p)
        except OSError:
            pass
print("scanned", files, "files; hits", hits)
`

// TestBrokerOnBothTiers runs a tool whose record lists the broker
// operation echo on runc and gvisor: the code reaches the loopback
// upstream through the broker with a secret it never sees (not in its
// output, environment or files, and redacted where the upstream echoes
// it), and an operation its record does not list is refused.
func TestBrokerOnBothTiers(t *testing.T) {
	var rb [12]byte
	_, _ = rand.Read(rb[:])
	secret := secretPrefix + hex.EncodeToString(rb[:])
	var mu sync.Mutex
	var upCalls []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		mu.Lock()
		upCalls = append(upCalls, r.URL.Path+"?"+r.URL.RawQuery)
		mu.Unlock()
		if auth != "Bearer "+secret {
			http.Error(w, "bad credential", http.StatusUnauthorized)
			return
		}
		// A careless upstream echoes the credential; the broker must not.
		fmt.Fprintf(w, "upstream %s msg=%s auth=%s", r.URL.Path, r.URL.Query().Get("msg"), auth)
	}))
	defer up.Close()
	lookupEnv := func(name string) (string, bool) {
		if name == "ECHO_TOKEN" {
			return secret, true
		}
		return "", false
	}
	b := &broker.Config{
		Operations: []broker.Operation{
			{Name: "echo", Method: http.MethodGet, URL: up.URL + "/echo", Params: []broker.Param{{Name: "msg", Required: true}},
				Credential: broker.Credential{Env: "ECHO_TOKEN"}, Prefix: "Bearer "},
			{Name: "other", Method: http.MethodGet, URL: up.URL + "/other", Params: []broker.Param{{Name: "msg"}},
				Credential: broker.Credential{Env: "ECHO_TOKEN"}, Prefix: "Bearer "},
		},
		LookupEnv: lookupEnv,
	}
	env := newEgressEnv(t, `
tools:
  - name: brokered
    input_trust: trusted
    tier: gvisor
    runtimes: [python]
    credentials: [echo]
`, nil, nil, b)
	var events []BrokerEvent
	env.eng.SetBrokerObserver(func(ev BrokerEvent) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	})

	for _, drv := range []string{"runc", "gvisor"} {
		t.Run(drv, func(t *testing.T) {
			mu.Lock()
			upCalls, events = nil, nil
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, err := env.eng.Run(ctx, Request{Tool: "brokered", Driver: drv, Runtime: "python", Code: []byte(brokerScript),
				Limits: sandbox.Limits{Timeout: time.Minute}})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("sandbox output:\n%s%s", res.Stdout, res.Stderr)
			out := res.Stdout + res.Stderr
			for _, want := range []string{
				"echo 200 upstream /echo msg=hello auth=Bearer [redacted by stockade]",
				`other 403 {"error":"operation \"other\" is not in tool \"brokered\"'s credentials"}`,
				"; hits []",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\nstdout %s\nstderr %s", want, res.Stdout, res.Stderr)
				}
			}
			if strings.Contains(out, secret) || strings.Contains(out, secretPrefix) {
				t.Errorf("the secret reached the sandbox's output:\n%s", out)
			}
			if strings.Contains(out, "scanned 0 files") {
				t.Errorf("the scan read no file:\n%s", out)
			}
			if err := env.eng.Wait(t.Context()); err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(upCalls) != 1 || upCalls[0] != "/echo?msg=hello" {
				t.Errorf("upstream calls %v, want only /echo?msg=hello", upCalls)
			}
			var allowed, refused int
			for _, ev := range events {
				switch {
				case ev.Allowed && ev.Operation == "echo" && ev.Status == http.StatusOK && ev.Tool == "brokered":
					allowed++
				case !ev.Allowed && ev.Operation == "other":
					refused++
				}
			}
			if allowed != 1 || refused != 1 {
				t.Errorf("broker events %+v, want echo allowed and other refused", events)
			}
		})
	}
}

// TestCredentialsNeedConfiguredOperations checks that an engine with
// egress refuses a tool whose credentials name an operation its broker
// does not have, or any operation when it has no broker.
func TestCredentialsNeedConfiguredOperations(t *testing.T) {
	opts := tools.Options{EgressSupported: true, Drivers: DriverCapabilities()}
	set, err := tools.Load(writeTools(t, `
tools:
  - name: brokered
    input_trust: trusted
    tier: gvisor
    runtimes: [python]
    credentials: [echo, missing]
`), opts)
	if err != nil {
		t.Fatal(err)
	}
	nets, err := netns.NewManager(netns.Config{Prefix: egressTestPrefix, Range: egressTestRange})
	if err != nil {
		t.Fatal(err)
	}
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	newEngine := func(b *broker.Config) error {
		host, err := NewEgressHost(nets, egress.Config{}, b)
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(map[string]sandbox.Driver{"gvisor": drv}, "gvisor", sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
			WithTools(set, opts), WithEgress(host))
		return err
	}
	for _, tt := range []struct {
		name string
		b    *broker.Config
		want string
	}{
		{"unknown operation", brokerOf("echo"), `broker operation "missing"`},
		{"no broker", nil, `broker operation "echo"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := newEngine(tt.b); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want invalid argument naming %s", err, tt.want)
			}
		})
	}
	if err := newEngine(brokerOf("echo", "missing")); err != nil {
		t.Errorf("with both operations configured: %v", err)
	}
}

// brokerOf configures a broker with the operations names.
func brokerOf(names ...string) *broker.Config {
	var ops []broker.Operation
	for _, n := range names {
		ops = append(ops, broker.Operation{Name: n, Method: http.MethodGet, URL: "http://127.0.0.1:1/", Credential: broker.Credential{Env: "X"}})
	}
	return &broker.Config{Operations: ops}
}

// TestBrokerSessionNotSnapshotted: a session whose tool lists broker
// operations has a network though it asked for none (NetworkBroker), so
// a snapshot of it is refused (409 with the reason) before the driver is
// asked, and the session serves on.
func TestBrokerSessionNotSnapshotted(t *testing.T) {
	b := &broker.Config{
		Operations: []broker.Operation{{Name: "echo", Method: http.MethodGet, URL: "http://127.0.0.1:9/echo", Credential: broker.Credential{Env: "ECHO_TOKEN"}}},
		LookupEnv:  func(string) (string, bool) { return "x", true },
	}
	env := newEgressEnv(t, `
tools:
  - name: brokered
    input_trust: trusted
    tier: gvisor
    runtimes: [python]
    credentials: [echo]
`, nil, nil, b)
	s, err := env.eng.OpenSession(t.Context(), SessionSpec{Runtime: "python", Tool: "brokered", Workspace: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if got := s.Network(); got != NetworkBroker {
		t.Fatalf("the session's network: got %q, want %q", got, NetworkBroker)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	_, _, err = env.eng.SnapshotSession(t.Context(), s, dir, nil)
	if msg, ok := errdefs.PublicMessage(err); !errdefs.IsFailedPrecondition(err) || !ok || !strings.Contains(msg, "network") {
		t.Fatalf("SnapshotSession of a broker session: got %v, want a public failed precondition naming the network", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the refused snapshot's directory: got %v, want none", err)
	}
	if r := cell(t, s, "print(6 * 7)", 30*time.Second); strings.TrimSpace(r.Stdout) != "42" {
		t.Errorf("the session after the refusal: got stdout %q stderr %q", r.Stdout, r.Stderr)
	}
}
