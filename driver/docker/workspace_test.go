package docker_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestWorkspaceRefused checks that a spec asking for a /workspace (a
// session's) is refused before anything is created: the docker driver
// cannot keep sessions.
func TestWorkspaceRefused(t *testing.T) {
	d, err := docker.New(docker.Config{Host: "unix://" + filepath.Join(t.TempDir(), "none.sock"), GuestPath: "/nonexistent/guest"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Create(t.Context(), sandbox.Spec{Image: sandbox.Image{Name: "shell"}, Workspace: 1 << 20}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "/workspace") {
		t.Fatalf("got %v, want ErrInvalidArgument refusing the /workspace", err)
	}
}
