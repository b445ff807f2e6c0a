package config

import (
	"fmt"
	"net/url"
	"path/filepath"

	"go.yaml.in/yaml/v3"

	"github.com/stockade-sh/stockade/templates"
)

// TemplateSources are where a template build fetches what a declaration
// adds to its base (README, "Templates"): the daemon fetches on the host,
// only from these, and installs inside a build sandbox without network.
//
//	template_sources:
//	  mirror: http://deb.debian.org/debian
//	  wheelhouse: /var/lib/stockade/wheelhouse
//	  python_index: https://pypi.org/simple
//	  npm_registry: https://registry.npmjs.org
type TemplateSources struct {
	// Mirror is the Debian mirror of debian_packages; Default sets
	// DefaultMirror, the runtime images' own.
	Mirror string `yaml:"mirror"`
	// Wheelhouse is the directory of the wheels a template names by file;
	// empty means DataDir/wheelhouse (see Config.Wheelhouse).
	Wheelhouse string `yaml:"wheelhouse"`
	// PythonIndex is a PEP 503 simple index for the wheels a template
	// names by project==version; empty means none: such wheels are refused
	// at build time.
	PythonIndex string `yaml:"python_index"`
	// NPMRegistry is the npm registry of npm_packages; Default sets
	// DefaultNPMRegistry.
	NPMRegistry string `yaml:"npm_registry"`
}

// checkTemplateSources returns the first problem of the template sources.
func (c Config) checkTemplateSources() error {
	s := c.TemplateSources
	for _, u := range []struct{ key, v string }{
		{"template_sources.mirror", s.Mirror}, {"template_sources.python_index", s.PythonIndex}, {"template_sources.npm_registry", s.NPMRegistry},
	} {
		if u.v == "" {
			continue
		}
		p, err := url.Parse(u.v)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.User != nil || p.RawQuery != "" || p.Fragment != "" {
			return fmt.Errorf("%s %q: want an http or https URL without credentials, query or fragment, such as https://registry.example", u.key, u.v)
		}
	}
	if s.Wheelhouse != "" && !filepath.IsAbs(s.Wheelhouse) {
		return fmt.Errorf("template_sources.wheelhouse %q must be an absolute path", s.Wheelhouse)
	}
	return nil
}

// TemplatesList is a list of templates written in a configuration file.
type TemplatesList struct {
	// File names the configuration file, in the problems found in the list.
	File string
	// Node is the YAML sequence of the templates, with its positions.
	Node *yaml.Node
}

// SetTemplates makes path the templates file or directory, replacing a
// list of templates the configuration file gave.
func (c *Config) SetTemplates(path string) { c.Templates, c.TemplatesList = path, nil }

// TemplateOptions are the options the configured templates are validated
// with: their files must lie under the tools' data root (MountRoot).
func (c Config) TemplateOptions() templates.Options {
	return templates.Options{DataRoot: c.MountRoot()}
}

// LoadTemplates loads the configured templates (TemplatesList, or the
// Templates path) with TemplateOptions; see templates.Load. None
// configured is an empty set.
func (c Config) LoadTemplates() (*templates.Set, error) {
	if c.TemplatesList != nil {
		return templates.LoadList(c.TemplatesList.File, c.TemplatesList.Node, c.TemplateOptions())
	}
	return templates.Load(c.Templates, c.TemplateOptions())
}

// pathOrList is a key that takes a path or a list written in the file
// itself: tools: and templates:.
type pathOrList struct {
	path string
	list *yaml.Node
	form string
}

func (t *pathOrList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		t.path = n.Value
	case yaml.SequenceNode:
		t.list = n
	default:
		return fmt.Errorf("want %s, got a %s", t.YAMLForm(), kindWord(n))
	}
	return nil
}

func (t *pathOrList) YAMLForm() string {
	if t.form == "" {
		return "the path of a file or directory, or a list"
	}
	return t.form
}

// relativeTo returns p, relative to the directory of the configuration
// file, as an absolute path.
func relativeTo(file, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(file), p)
}
