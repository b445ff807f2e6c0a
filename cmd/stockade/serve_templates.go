package main

import (
	"log/slog"
	"path/filepath"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/templatejobs"
)

// templateJobs returns the daemon's build jobs of cfg's templates, which
// build into cfg's image store from its template sources, audit into au
// and make golden checkpoints with golden where it can (an engine whose
// tier cannot restore one says so, and the template starts cold). The
// templates are loaded as wiring.Engine loaded them for the tools. prune
// runs after each job that made a build.
func templateJobs(cfg config.Config, golden templatejobs.GoldenMaker, au templatejobs.Auditor, prune func() error, log *slog.Logger) (*templatejobs.Jobs, error) {
	set, err := cfg.LoadTemplates()
	if err != nil {
		return nil, err
	}
	o := templatejobs.Options{Templates: set, Audit: au, Logger: log, Golden: golden, Prune: prune,
		Builder: templatejobs.StoreBuilder{Store: image.Open(cfg.ImageDir()), Options: image.TemplateOptions{
			Sources: templateSources(&cfg), RunscPath: cfg.RunscPath, StateDir: filepath.Join(cfg.StateDir, "template-builds")}},
		Describe: func(err error) (string, bool) { _, d, hidden := api.Public(err); return d.Message, hidden }}
	return templatejobs.New(o), nil
}
