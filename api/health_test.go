package api_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestBrokenDriverIsUnavailable runs the default tool on gVisor with a
// runtime that is not one (/bin/false as runsc) and with a guest agent
// that is not one (one byte): each invocation is refused with 503
// (decision driver_unavailable), nothing charged, instead of being
// admitted to end launch_failed, and /healthz names the driver and why.
// The real runsc and guest stay healthy and run.
func TestBrokenDriverIsUnavailable(t *testing.T) {
	testenv.RequiresBinary(t, "runsc")
	oneByte := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(oneByte, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, runsc, guest string
		why                string // in /healthz and the log; "" when healthy
	}{
		{name: "runsc is /bin/false", runsc: "/bin/false", why: "/bin/false --version failed"},
		{name: "one-byte guest", guest: oneByte, why: "is not an ELF executable"},
		{name: "real runsc and guest"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			guest := tt.guest
			if guest == "" {
				guest = testenv.Guest(t)
			}
			d, err := gvisor.New(gvisor.Config{Binary: tt.runsc, StateDir: t.TempDir(), GuestPath: guest})
			if err != nil {
				t.Fatal(err)
			}
			e := newEnv(t, backends[0], envConfig{credits: 10, policy: noApproval, drivers: map[string]sandbox.Driver{"gvisor": d}, defaultDriver: "gvisor"})
			var health struct {
				Status  string            `json:"status"`
				Drivers map[string]string `json:"drivers"`
			}
			r := e.do("GET", "/healthz", "", nil)
			r.decode(t, &health)
			req := capability.InvokeRequest{Runtime: "python", Code: "print(6*7)"}
			if tt.why == "" {
				r.want(t, http.StatusOK)
				if health.Drivers["gvisor"] != "ok" {
					t.Errorf("/healthz: got gvisor %q, want ok", health.Drivers["gvisor"])
				}
				v := e.invoke(req).want(t, http.StatusOK).execution(t)
				if string(v.Status) != string(model.StatusSucceeded) {
					t.Fatalf("execution: got %s (%s), want succeeded", v.Status, v.Result)
				}
				return
			}
			r.want(t, http.StatusServiceUnavailable)
			if g := health.Drivers["gvisor"]; health.Status != "degraded" || !strings.Contains(g, tt.why) || strings.HasSuffix(g, "unavailable") || health.Drivers["runc"] != "ok" {
				t.Errorf("/healthz: got %s, want degraded, gvisor failing with %q, runc ok", r.body, tt.why)
			}
			e.invoke(req).wantError(t, http.StatusServiceUnavailable, "unavailable", "the gvisor sandbox driver is unavailable")
			denied := e.events("capability.invoke_denied", "")
			if len(denied) != 1 || decisionOf(t, denied[0]) != "driver_unavailable" {
				t.Errorf("invoke_denied events: got %+v, want one driver_unavailable", denied)
			}
			e.wantCredits(10, 0)
			if calls := e.toolCalls(""); len(calls) != 0 {
				t.Errorf("tool_calls rows: got %d, want none (refused, not launched)", len(calls))
			}
		})
	}
}
