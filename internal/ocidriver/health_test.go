package ocidriver_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// drivers builds each OCI driver with binary (empty: the real runtime) and
// guest (empty: the real guest agent), each in a state directory of its
// own.
var drivers = []struct {
	name    string
	runtime string
	build   func(t testing.TB, binary, guest string) (*ocidriver.Driver, error)
}{
	{"runc", "runc", func(t testing.TB, binary, guest string) (*ocidriver.Driver, error) {
		return runc.New(runc.Config{Binary: binary, StateDir: t.TempDir(), GuestPath: guest})
	}},
	{"gvisor", "runsc", func(t testing.TB, binary, guest string) (*ocidriver.Driver, error) {
		d, err := gvisor.New(gvisor.Config{Binary: binary, StateDir: t.TempDir(), GuestPath: guest})
		if err != nil {
			return nil, err
		}
		return d.Driver, nil
	}},
}

// writeExecutable writes an executable file named name into a temporary
// directory and returns its path.
func writeExecutable(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHealth checks that Health and SelfTest tell a driver that can run
// sandboxes from one that cannot: a runtime that is not one (/bin/false), a
// guest agent that is not one (one byte), and a runtime that answers its
// version but runs nothing, which only the self-test catches and which
// Health then reports.
func TestHealth(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			testenv.RequiresBinary(t, drv.runtime)
			guest := testenv.Guest(t)
			versionOnly := writeExecutable(t, drv.runtime, fmt.Sprintf("#!/bin/sh\n[ \"$1\" = --version ] && echo '%s version 1.0' && exit 0\necho 'cannot run anything' >&2\nexit 1\n", drv.runtime))
			for _, tt := range []struct {
				name          string
				binary, guest string
				// wantHealth and wantSelfTest are "" for healthy, else
				// in the error; after the self-test, Health answers
				// what it found.
				wantHealth, wantSelfTest string
			}{
				{name: "real", guest: guest},
				{name: "runtime /bin/false", binary: "/bin/false", guest: guest, wantHealth: "/bin/false --version failed", wantSelfTest: "/bin/false --version failed"},
				{name: "runtime missing", binary: "/nonexistent/" + drv.runtime, guest: guest, wantHealth: "not found", wantSelfTest: "not found"},
				{name: "one-byte guest", guest: writeExecutable(t, "guest", "x"), wantHealth: "is not an ELF executable", wantSelfTest: "is not an ELF executable"},
				{name: "shell script guest", guest: writeExecutable(t, "guest", "#!/bin/sh\nexit 0\n"), wantHealth: "is not an ELF executable", wantSelfTest: "is not an ELF executable"},
				{name: "runtime answers only its version", binary: versionOnly, guest: guest, wantSelfTest: "cannot run anything"},
			} {
				t.Run(tt.name, func(t *testing.T) {
					d, err := drv.build(t, tt.binary, tt.guest)
					if err != nil {
						t.Fatal(err)
					}
					check := func(what string, err error, want string) {
						t.Helper()
						switch {
						case want == "" && err != nil:
							t.Errorf("%s: got %v, want healthy", what, err)
						case want != "" && (!errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), want)):
							t.Errorf("%s: got %v, want ErrUnavailable containing %q", what, err, want)
						}
					}
					check("Health", d.Health(t.Context()), tt.wantHealth)
					check("SelfTest", d.SelfTest(t.Context()), tt.wantSelfTest)
					check("Health after the self-test", d.Health(t.Context()), tt.wantSelfTest)
				})
			}
		})
	}
}

// BenchmarkHealth measures Health as the hot path pays it (a cached
// answer, once per invocation) against the check behind it (the runtime's
// `--version` and the guest's headers), which the cache runs at most once
// per sandboxkit.HealthTTL, in the background once it has an answer.
func BenchmarkHealth(b *testing.B) {
	testenv.RequiresRoot(b)
	guest := testenv.Guest(b)
	for _, drv := range drivers {
		b.Run(drv.name, func(b *testing.B) {
			testenv.RequiresBinary(b, drv.runtime)
			const checks = 10
			start := time.Now()
			for range checks {
				d, err := drv.build(b, "", guest)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.Health(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			uncached := time.Since(start) / checks
			d, err := drv.build(b, "", guest)
			if err != nil {
				b.Fatal(err)
			}
			if err := d.Health(b.Context()); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if err := d.Health(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			cached := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(uncached.Nanoseconds()), "check-ns")
			b.ReportMetric(float64(uncached)/float64(max(cached, 1)), "check/cached")
		})
	}
}
