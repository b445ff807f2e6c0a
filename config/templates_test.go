package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

// TestLoadFileTemplates checks both forms of templates: a list in the file
// itself and a path, relative to the file's directory; a later
// SetTemplates (a flag) replaces either.
func TestLoadFileTemplates(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "stockade.yaml")
	write := func(s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("listen: 127.0.0.1:9000\ntemplates:\n  - name: analytics\n    base: python\n")
	c := Default()
	if err := c.LoadFile(p); err != nil {
		t.Fatal(err)
	}
	set, err := c.LoadTemplates()
	if err != nil {
		t.Fatal(err)
	}
	if a, err := set.Get("analytics"); err != nil || a.Source != p+":3" {
		t.Errorf("got %+v, %v, want template analytics defined at %s:3", a, err, p)
	}

	write("templates: templates.d\n")
	c = Default()
	if err := c.LoadFile(p); err != nil {
		t.Fatal(err)
	}
	if c.Templates != filepath.Join(dir, "templates.d") || c.TemplatesList != nil {
		t.Errorf("got templates %q (list %v), want %s", c.Templates, c.TemplatesList, filepath.Join(dir, "templates.d"))
	}
	write("templates: [{name: a, base: ruby}]\n")
	c = Default()
	if err := c.LoadFile(p); err != nil {
		t.Fatal(err)
	}
	if _, err := c.LoadTemplates(); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), p+`:1: template "a": templates[0].base: unknown base "ruby"`) {
		t.Errorf("a bad inline template: got %v, want its problem at its line", err)
	}
	c.SetTemplates("")
	if set, err := c.LoadTemplates(); err != nil || set.Len() != 0 {
		t.Errorf("after SetTemplates(\"\"): got %v, %v, want no template", set, err)
	}

	write("templates: {name: a}\n")
	c = Default()
	if err := c.LoadFile(p); err == nil || !strings.Contains(err.Error(), "templates: want the path of a templates file or directory, or a list of templates, got a mapping") {
		t.Errorf("templates as a mapping: got %v", err)
	}
}

func TestTemplateSources(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "stockade.yaml")
	if err := os.WriteFile(p, []byte("data_dir: /srv/stk\ntemplate_sources:\n  python_index: https://pypi.example/simple\n  npm_registry: http://127.0.0.1:4873\n  colour: red\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := Default()
	if err := c.LoadFile(p); err == nil || !strings.Contains(err.Error(), p+`:5: template_sources: unknown key "colour" (known: mirror, wheelhouse, python_index, npm_registry)`) {
		t.Errorf("an unknown source key: got %v", err)
	}
	if err := os.WriteFile(p, []byte("data_dir: /srv/stk\ntemplate_sources:\n  python_index: https://pypi.example/simple\n  npm_registry: http://127.0.0.1:4873\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c = Default()
	if err := c.LoadFile(p); err != nil {
		t.Fatal(err)
	}
	if s := c.TemplateSources; s.PythonIndex != "https://pypi.example/simple" || s.NPMRegistry != "http://127.0.0.1:4873" || s.Mirror != DefaultMirror || c.Wheelhouse() != "/srv/stk/wheelhouse" {
		t.Errorf("sources from the file: got %+v, wheelhouse %s", s, c.Wheelhouse())
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	for _, tc := range []struct {
		edit func(*TemplateSources)
		want string
	}{
		{func(s *TemplateSources) { s.Mirror = "deb.debian.org/debian" }, "template_sources.mirror \"deb.debian.org/debian\": want an http or https URL"},
		{func(s *TemplateSources) { s.NPMRegistry = "ftp://registry" }, "template_sources.npm_registry"},
		{func(s *TemplateSources) { s.PythonIndex = "https://user:pw@pypi.example/simple" }, "without credentials"},
		{func(s *TemplateSources) { s.Wheelhouse = "wheels" }, `template_sources.wheelhouse "wheels" must be an absolute path`},
	} {
		c := Default()
		tc.edit(&c.TemplateSources)
		if err := c.Validate(); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
}
