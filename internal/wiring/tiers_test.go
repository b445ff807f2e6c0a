package wiring

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// tiersTable renders what drivers declare as the README's table of the
// tiers.
func tiersTable(drivers map[string]sandbox.Capabilities) string {
	var b strings.Builder
	b.WriteString("| tier | driver | boundary | kernel | CPU default | network |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, tier := range sandbox.Tiers() {
		name, c, ok := tools.DriverFor(drivers, tier)
		if !ok {
			continue
		}
		kernel := "its own"
		if c.SharedKernel {
			kernel = "the host's"
		}
		var modes []string
		for _, m := range c.NetworkModes {
			modes = append(modes, map[sandbox.NetworkMode]string{sandbox.NetworkNone: "none", sandbox.NetworkEgress: "egress", sandbox.NetworkAllowlist: "the provider's allowlist"}[m])
		}
		b.WriteString("| " + strings.Join([]string{string(tier), "`" + name + "`", c.Boundary, kernel, strconv.FormatFloat(c.DefaultCPU, 'g', -1, 64), strings.Join(modes, ", ")}, " | ") + " |\n")
	}
	return b.String()
}

// TestTiersInREADME checks that the README's table of the tiers is what
// the drivers declare, and that it would notice a changed declaration.
func TestTiersInREADME(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	holds := func(table string) bool {
		i := strings.Index(string(b), "\n"+table)
		return i >= 0 && strings.HasPrefix(string(b)[i+1+len(table):], "\n")
	}
	want := tiersTable(DriverCapabilities(config.Default()))
	if !holds(want) {
		t.Errorf("README.md does not hold the tiers' table as the drivers declare it:\n%s", want)
	}
	changed := DriverCapabilities(config.Default())
	c := changed["docker"]
	c.NetworkModes = slices.Concat(c.NetworkModes, []sandbox.NetworkMode{sandbox.NetworkEgress})
	changed["docker"] = c
	if holds(tiersTable(changed)) {
		t.Errorf("the README check passes a docker driver with egress, want it to fail")
	}
}

// TestDriverCapabilities checks that DriverCapabilities declares what the
// drivers Engine builds declare, for every driver the configuration knows.
func TestDriverCapabilities(t *testing.T) {
	names := slices.Concat(slices.Collect(maps.Keys(DriverCapabilities(config.Default()))), []string{KubernetesGVisor})
	if got, want := slices.Sorted(slices.Values(names)), slices.Sorted(slices.Values(config.DriverNames)); !slices.Equal(got, want) {
		t.Errorf("DriverCapabilities declares drivers %v, want the configuration's %v", got, want)
	}
	kube := config.Default()
	kube.Driver, kube.Kubernetes.Kubeconfig = KubernetesGVisor, kubeconfig(t)
	kube.Kubernetes.ContainerClass, kube.Kubernetes.SeccompDir = "runc-nonet", t.TempDir()
	for _, cfg := range []config.Config{config.Default(), kube} {
		// No egress: Open then touches nothing on the host.
		cfg.DataDir, cfg.StateDir, cfg.GuestPath, cfg.Egress = t.TempDir(), t.TempDir(), "/nonexistent/guest", false
		if cfg.Driver != KubernetesGVisor {
			// The vercel and modal drivers are built with credentials;
			// they do no I/O until used.
			cfg.Vercel = config.Vercel{Token: "t", TeamID: "team", ProjectID: "prj", API: "http://127.0.0.1:1"}
			cfg.Modal = config.Modal{TokenID: "ak", TokenSecret: "as", API: "http://127.0.0.1:1"}
		}
		e, err := Engine(cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := tools.CapabilitiesOf(e.Drivers())
		declared := DriverCapabilities(cfg)
		if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(declared))) {
			t.Errorf("driver %s: Engine builds %v, DriverCapabilities declares %v", cfg.Driver, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(declared)))
		}
		for name, want := range declared {
			if !reflect.DeepEqual(got[name], want) {
				t.Errorf("driver %s: Engine's declares %+v, DriverCapabilities %+v", name, got[name], want)
			}
		}
	}
}
