package docker

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestContainerConfigGolden pins the whole container configuration to a
// golden file, so that a change of the profile shows in review. The
// seccomp profile, internal/oci's, has golden files of its own.
func TestContainerConfigGolden(t *testing.T) {
	d, err := New(Config{GuestPath: "/nonexistent/guest"})
	if err != nil {
		t.Fatal(err)
	}
	spec := sandbox.Spec{Labels: map[string]string{"tool": "x"}, Mounts: []sandbox.Mount{{Source: "/var/lib/stockade/data/sales", Target: "/data/sales"}}}
	cc, hc, err := d.containerConfig("sbx-1", spec, d.cfg.Defaults, "stockade/shell:t")
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range hc.SecurityOpt {
		if strings.HasPrefix(o, "seccomp=") {
			hc.SecurityOpt[i] = "seccomp=<internal/oci's profile>"
		}
	}
	got, err := json.MarshalIndent(struct {
		Config     any
		HostConfig any
	}{cc, hc}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	file := filepath.Join("testdata", "container_config.json")
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test -run TestContainerConfigGolden -update to write it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs from the container configuration:\n%s\nreview and run go test ./driver/docker -run TestContainerConfigGolden -update", file, got)
	}
}
