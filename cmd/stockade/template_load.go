package main

import (
	"errors"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/templates"
	"github.com/stockade-sh/stockade/tools"
)

// templatesConfigured reports whether cfg names templates at all.
func templatesConfigured(cfg *config.Config) bool {
	return cfg.Templates != "" || cfg.TemplatesList != nil
}

// loadTemplates loads the configured templates as the daemon does. A
// configuration with problems is a templates.Problems; a path that cannot
// be read is bad input.
func loadTemplates(cfg *config.Config) (*templates.Set, error) {
	set, err := cfg.LoadTemplates()
	var ps templates.Problems
	if err != nil && !errors.As(err, &ps) {
		return nil, usageError{err}
	}
	return set, err
}

// templateSources are where cfg's template builds fetch from.
func templateSources(cfg *config.Config) image.TemplateSources {
	return wiring.TemplateSources(*cfg)
}

// lintTemplates returns the problems of the templates list and of the
// configured tools, with the daemon's rules: a tool naming a template
// is checked against it (tools.LintTemplate).
func lintTemplates(cfg *config.Config, set *templates.Set, list []templates.Template) ([]string, error) {
	var out []string
	for _, p := range templates.Validate(list, templates.Options{DataRoot: cfg.MountRoot()}) {
		out = append(out, p.String())
	}
	opts := toolOptions(cfg)
	opts.Templates = set
	_, err := wiring.LoadTools(*cfg, opts)
	var ps tools.Problems
	switch {
	case errors.As(err, &ps):
		for _, p := range ps {
			out = append(out, p.String())
		}
		return out, nil
	case err != nil:
		return nil, usageError{err}
	}
	return out, nil
}
