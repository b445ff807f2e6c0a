package docker

import (
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestWorkspaceTmpfs checks that a spec asking for a /workspace (a
// session's: the docker driver keeps sessions as long as the daemon that
// opened them, without re-attaching) gets a tmpfs of that size there,
// and that a one-shot spec gets none.
func TestWorkspaceTmpfs(t *testing.T) {
	d, err := New(Config{GuestPath: "/nonexistent/guest"})
	if err != nil {
		t.Fatal(err)
	}
	_, hc, err := d.containerConfig("sbx-1", sandbox.Spec{Workspace: 8 << 20}, d.cfg.Defaults, "stockade/shell:t")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hc.Tmpfs["/workspace"], "rw,exec,nosuid,nodev,mode=1777,size=8388608"; got != want {
		t.Errorf("a session's /workspace: got tmpfs %q, want %q", got, want)
	}
	_, hc, err = d.containerConfig("sbx-2", sandbox.Spec{}, d.cfg.Defaults, "stockade/shell:t")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := hc.Tmpfs["/tmp"]; !ok {
		t.Fatalf("a one-shot's tmpfs mounts %v lack /tmp: the check below could not see one", hc.Tmpfs)
	}
	if got, ok := hc.Tmpfs["/workspace"]; ok {
		t.Errorf("a one-shot sandbox has a /workspace tmpfs %q, want none", got)
	}
}

// TestDetachedRefused checks that a detached spec is refused before
// anything is created: the docker driver cannot re-attach a sandbox.
func TestDetachedRefused(t *testing.T) {
	d, err := New(Config{Host: "unix:///nonexistent/none.sock", GuestPath: "/nonexistent/guest"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Create(t.Context(), sandbox.Spec{Image: sandbox.Image{Name: "shell"}, Detached: true, Workspace: 1 << 20})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "cannot detach") {
		t.Fatalf("got %v, want the refusal of a detached sandbox", err)
	}
}
