package engine

import (
	"context"
	"encoding/base64"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// specsOf is a driver that records the specs of the sandboxes it is asked
// for.
type specsOf struct {
	*docker.Driver
	mu    sync.Mutex
	specs []sandbox.Spec
}

func (d *specsOf) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	d.mu.Lock()
	d.specs = append(d.specs, spec)
	d.mu.Unlock()
	return d.Driver.Create(ctx, spec)
}

// TestSessionDocker opens a session on the docker driver, which keeps
// sessions without re-attaching them: its container is not detached, a
// variable and a /workspace file carry from cell to cell, a file written
// through the session reads back in a cell, a matplotlib figure comes
// back as a PNG, and Close leaves nothing.
func TestSessionDocker(t *testing.T) {
	host := os.Getenv("STOCKADE_TEST_DOCKER_HOST")
	if host == "" {
		testenv.Missing(t, "STOCKADE_TEST_DOCKER_HOST is not set; start a dockerd with `scripts/dockerd.sh start DIR` and set it to what that prints")
	}
	d, err := docker.New(docker.Config{Host: host, GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Health(t.Context()); err != nil {
		t.Fatalf("Health: %v", err)
	}
	rec := &specsOf{Driver: d}
	e, err := New(map[string]sandbox.Driver{"docker": rec}, "docker", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	s, err := e.OpenSession(ctx, SessionSpec{Runtime: "python", Workspace: 16 << 20})
	if err != nil {
		t.Fatalf("a session on docker: %v", err)
	}
	rec.mu.Lock()
	specs := rec.specs
	rec.mu.Unlock()
	if len(specs) != 1 || specs[0].Detached || specs[0].Workspace != 16<<20 {
		t.Errorf("the sandboxes asked for: got %+v, want one not detached with a 16 MiB /workspace", specs)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = s.Close(context.Background())
		}
	})
	cell := func(code string) *CellResult {
		t.Helper()
		r, err := s.Cell(ctx, CellRequest{Code: code})
		if err != nil || r.Status != sandbox.StatusSucceeded {
			t.Fatalf("cell %q: got %+v, %v; want succeeded", code, r, err)
		}
		return r
	}
	cell("x = 6 * 7")
	if r := cell("print(x)"); r.Stdout != "42\n" {
		t.Errorf("a variable across cells: got %q, want 42", r.Stdout)
	}
	cell(`open("note.txt", "w").write("from a cell")`)
	if b, _, err := s.ReadFile(ctx, "note.txt", 1<<20); err != nil || string(b) != "from a cell" {
		t.Errorf("reading the cell's file: got %q, %v", b, err)
	}
	if _, _, err := s.WriteFile(ctx, "sales.csv", strings.NewReader("region,total\nnorth,42\nsouth,8\n"), 1<<20); err != nil {
		t.Fatal(err)
	}
	cell(`import pandas as pd; df = pd.read_csv("sales.csv")`)
	if r := cell("print(df.total.sum())"); r.Stdout != "50\n" {
		t.Errorf("the file written through the session: got %q, want 50", r.Stdout)
	}
	png := false
	for _, o := range cell(`df.plot.bar(x="region")`).Outputs {
		if b, err := base64.StdEncoding.DecodeString(o.Data); o.MimeType == "image/png" && err == nil && strings.HasPrefix(string(b), "\x89PNG\r\n") {
			png = true
		}
	}
	if !png {
		t.Errorf("the plot cell has no image/png output that is a PNG")
	}
	id := s.SandboxID()
	closed = true
	if err := s.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	if left := d.Leftovers(ctx, id); len(left) > 0 {
		t.Errorf("left after Close: %v", left)
	}
}
