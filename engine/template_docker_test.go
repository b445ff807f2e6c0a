package engine

import (
	"os"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// namedTemplates are testTemplates whose images are named after their
// template, as image.Store.ResolveTemplate names them: the docker driver
// imports them under that name and their digest.
type namedTemplates struct{ templateImages }

func (n namedTemplates) ResolveTemplate(name string) (sandbox.Image, image.Manifest, error) {
	img, m, err := n.templateImages.ResolveTemplate(name)
	img.Name = name
	return img, m, err
}

// TestTemplateDocker runs one-shots of templates on the docker driver,
// which imports a template's image by its digest as it does a runtime's:
// a python template's and a shell template's program see what Start made,
// the template's Env and Workdir.
func TestTemplateDocker(t *testing.T) {
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
	e, err := New(map[string]sandbox.Driver{"docker": d}, "docker", namedTemplates{testTemplates()}, sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		templateTools(t, "docker")...)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ tool, code, want string }{
		{"analytics", seesTemplate, wantTemplate},
		{"shelly", `echo "$((X + 1)) $TPL_GREETING $(pwd)"`, "42 hi /tmp\n"},
	} {
		res, err := e.Run(t.Context(), Request{Tool: c.tool, Code: []byte(c.code)})
		if err != nil {
			t.Fatalf("%s: %v", c.tool, err)
		}
		if res.Driver != "docker" || res.Status != sandbox.StatusSucceeded || res.Stdout != c.want || res.Stderr != "" {
			t.Errorf("%s on docker: got driver %s, %s, stdout %q, stderr %q; want succeeded, %q", c.tool, res.Driver, res.Status, res.Stdout, res.Stderr, c.want)
		}
	}
	// The images are the engine's under the templates' names and digests
	// (ImportImage finds them imported).
	for _, name := range []string{"analytics", "shelly"} {
		img, _, err := namedTemplates{testTemplates()}.ResolveTemplate(name)
		if err != nil {
			t.Fatal(err)
		}
		tag, err := d.ImportImage(t.Context(), img)
		if want := docker.ImageRepo + name + ":" + img.Digest[len("sha256:"):][:12]; err != nil || !strings.HasPrefix(tag, want) {
			t.Errorf("docker image of template %s: %q, %v; want %s-...", name, tag, err, want)
		}
	}
}
