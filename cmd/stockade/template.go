package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/templatejobs"
	"github.com/stockade-sh/stockade/templates"
)

func init() {
	commands["template"] = command{summary: "list, show, build and lint templates: the environments of tools' sandboxes", run: templateCmd}
}

const templateUsage = `usage: stockade template list [--templates FILE|DIR | --config FILE] [--url URL] [--json]
       stockade template show NAME [--templates FILE|DIR | --config FILE] [--url URL] [--json]
       stockade template build NAME [--pull] [-v] [--templates FILE|DIR | --config FILE] [--url URL]
       stockade template lint [NAME] [--templates FILE|DIR | --config FILE]

A template is an environment declared for tools' sandboxes: a base runtime
(python, node, shell) and what is added to it (Debian packages, npm
packages, python wheels, files, environment, working directory, start and
ready code). --templates names a templates file or a directory of *.yaml
files; --config the daemon's configuration file, whose templates (a path or
the list itself), template_sources, tools and data_dir are used.

Without --url (or STOCKADE_URL) the commands work here, on the image store
of the data directory (--data-dir, env STOCKADE_DATA_DIR, /var/lib/stockade):
building needs root, the base runtime's image and the package sources. With
--url they ask the daemon there (an admin key: --key or STOCKADE_KEY), which
builds as a job: Ctrl-C cancels it, and the previous build keeps serving.

list    the templates, each with its current build and whether it is stale
        (built from another declaration than the one configured)
show    a template's declaration, its current build and its SBOM: the Debian
        packages it added with their versions, wheels with version and
        sha256, npm packages with version and integrity, files
build   builds a template's image, printing its progress; an unchanged
        declaration is a cache hit that does no work (--pull resolves the
        packages again)
lint    checks the templates (all, or NAME) and the tools that name them
        with the daemon's rules; prints each problem on its own line and
        exits 1 if any
`

func templateCmd(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, templateUsage)
		return exitUsage
	}
	switch args[0] {
	case "list", "ls":
		return templateList(ctx, args[1:])
	case "show":
		return templateShow(ctx, args[1:])
	case "build":
		return templateBuild(ctx, args[1:])
	case "lint":
		return templateLint(args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Fprint(os.Stdout, templateUsage)
		return 0
	}
	return fail(usagef("unknown template command %q; want list, show, build or lint (stockade template --help)", args[0]))
}

// templateFlags holds what the template verbs share: the configuration
// (--config, --data-dir, --templates) and, for the verbs that may ask a
// daemon, --url and --key.
type templateFlags struct {
	fs     *flag.FlagSet
	cfg    *config.Config
	load   func([]string) ([]string, error)
	remote remoteFlags
	asJSON *bool
}

// newTemplateFlags registers the flags of a template verb; remote adds
// --url, --key and --json.
func newTemplateFlags(name string, remote bool) *templateFlags {
	f := &templateFlags{fs: newFlags("template "+name, templateUsage)}
	f.cfg, f.load = configFlags(f.fs, withConfigFile, withoutSandboxFlags)
	templatesFlag(f.fs, f.cfg)
	toolsFlag(f.fs, f.cfg)
	if name == "build" {
		f.fs.StringVar(&f.cfg.StateDir, "state-dir", f.cfg.StateDir, "directory for the build sandbox's runtime state (env STOCKADE_STATE_DIR)")
		f.fs.StringVar(&f.cfg.RunscPath, "runsc", f.cfg.RunscPath, "runsc executable of the build sandbox")
	}
	if remote {
		f.remote.register(f.fs, "the daemon's URL: ask it instead of working here")
		f.asJSON = f.fs.Bool("json", false, "print the answer as JSON on stdout")
	}
	return f
}

// parse parses args and returns the positional ones, which must number
// between min and max.
func (f *templateFlags) parse(args []string, min, max int) ([]string, error) {
	pos, err := f.load(args)
	if err != nil {
		return nil, flagErr(f.fs, err)
	}
	if len(pos) < min || len(pos) > max {
		return nil, usagef("%s: got %d arguments, want %s (stockade template --help)", f.fs.Name(), len(pos), argCount(min, max))
	}
	if f.asJSON != nil {
		f.remote.fromEnv(f.fs)
		if f.remote.url != "" {
			for _, name := range []string{"templates", "tools", "config", "data-dir", "state-dir", "runsc", "v"} {
				if isSet(f.fs, name) {
					return nil, usagef("--%s does not apply with %s (the daemon at %s), whose configuration holds the templates; give --url \"\" to work here instead", name, f.remote.urlFrom, f.remote.url)
				}
			}
		}
	}
	return pos, nil
}

// catalog loads the configured templates; without any it says which flag
// names them.
func (f *templateFlags) catalog() (*templates.Set, error) {
	set, err := loadTemplates(f.cfg)
	if err != nil {
		return nil, err
	}
	if set.Len() == 0 && !templatesConfigured(f.cfg) {
		return nil, usagef("no templates: name them with --templates FILE|DIR or --config FILE")
	}
	return set, nil
}

// localTemplates are the configured templates with their builds in the
// data directory's image store.
func (f *templateFlags) localTemplates(name string) ([]client.Template, error) {
	set, err := f.catalog()
	if err != nil {
		return nil, err
	}
	jobs := templatejobs.New(templatejobs.Options{Templates: set, Builder: templatejobs.StoreBuilder{Store: openImages(f.cfg.ImageDir())}})
	defer jobs.Close()
	var sts []templatejobs.Status
	if name == "" {
		sts, err = jobs.Templates()
	} else {
		var st templatejobs.Status
		st, err = jobs.Template(name)
		sts = append(sts, st)
	}
	if err != nil {
		return nil, classify(err)
	}
	out := []client.Template{}
	for _, st := range sts {
		decl, key := templatejobs.Declaration(st.Template)
		out = append(out, client.Template{Name: st.Template.Name, Base: st.Template.Base, Declaration: decl, DeclarationKey: key,
			Source: st.Template.Source, Golden: st.Template.Golden, Build: st.Build, Stale: st.Stale()})
	}
	return out, nil
}

func templateList(ctx context.Context, args []string) int {
	f := newTemplateFlags("list", true)
	if _, err := f.parse(args, 0, 0); err != nil {
		return report(err, *f.asJSON)
	}
	var list []client.Template
	var err error
	if f.remote.url != "" {
		var c *client.Client
		if c, err = f.remote.client(); err == nil {
			list, err = c.Templates(ctx)
			err = remoteErr(ctx, err)
		}
	} else {
		list, err = f.localTemplates("")
	}
	if err != nil {
		return report(err, *f.asJSON)
	}
	if *f.asJSON {
		printJSON(list)
		return 0
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tBASE\tBUILD\tDIGEST\tCREATED\tSOURCE")
	for _, t := range list {
		digest, created := "-", "-"
		if t.Build != nil {
			digest, created = shortDigest(t.Build.Digest), t.Build.Created.Local().Format("2006-01-02 15:04")
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, t.Base, buildState(t), digest, created, or(t.Source, "-"))
	}
	if err := w.Flush(); err != nil {
		return fail(err)
	}
	return 0
}

// buildState says whether a template's build serves its declaration.
func buildState(t client.Template) string {
	switch {
	case t.Job != nil:
		return "building"
	case t.Build == nil:
		return "not built"
	case t.Stale:
		return "stale"
	}
	return "current"
}

func or(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func templateShow(ctx context.Context, args []string) int {
	f := newTemplateFlags("show", true)
	pos, err := f.parse(args, 1, 1)
	if err != nil {
		return report(err, f.asJSON != nil && *f.asJSON)
	}
	var t *client.Template
	if f.remote.url != "" {
		var c *client.Client
		if c, err = f.remote.client(); err == nil {
			t, err = c.Template(ctx, pos[0])
			err = remoteErr(ctx, err)
		}
	} else {
		var list []client.Template
		if list, err = f.localTemplates(pos[0]); err == nil {
			t = &list[0]
		}
	}
	if err != nil {
		return report(err, *f.asJSON)
	}
	if *f.asJSON {
		printJSON(t)
		return 0
	}
	printTemplate(os.Stdout, *t)
	return 0
}

// printTemplate prints a template for people: its declaration, its build
// and its SBOM as a table.
func printTemplate(out io.Writer, t client.Template) {
	fmt.Fprintf(out, "template %s (base %s)", t.Name, t.Base)
	if t.Source != "" {
		fmt.Fprintf(out, ", defined in %s", t.Source)
	}
	fmt.Fprintln(out)
	var decl map[string]any
	_ = json.Unmarshal(t.Declaration, &decl)
	for _, k := range []string{"debian_packages", "npm_packages", "npm_scripts", "python_wheels", "files", "env", "workdir", "start", "ready", "golden"} {
		v, ok := decl[k]
		if l, isList := v.([]any); isList && len(l) == 0 {
			continue
		}
		if m, isMap := v.(map[string]any); isMap && len(m) == 0 {
			continue
		}
		if !ok || v == nil || v == "" || v == false {
			continue
		}
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(v)
		fmt.Fprintf(out, "  %-16s %s\n", k+":", strings.TrimSuffix(b.String(), "\n"))
	}
	fmt.Fprintf(out, "declaration      %s\n", t.DeclarationKey)
	if t.Job != nil {
		fmt.Fprintf(out, "building         job %s, %s\n", t.Job.ID, or(t.Job.Progress.Stage, "starting"))
	}
	if t.LastJob != nil {
		fmt.Fprintf(out, "last build job   %s %s", t.LastJob.ID, t.LastJob.State)
		if t.LastJob.Error != nil {
			fmt.Fprintf(out, ": %s", t.LastJob.Error.Message)
		}
		fmt.Fprintln(out)
	}
	if t.Golden {
		golden := "asked for: the daemon's builds make it where the tier can restore it"
		if t.LastJob != nil && t.LastJob.Golden != "" {
			golden = t.LastJob.Golden
		}
		fmt.Fprintf(out, "golden           %s\n", golden)
	}
	if t.Build == nil {
		fmt.Fprintf(out, "build            none: stockade template build %s\n", t.Name)
		return
	}
	b := t.Build
	fmt.Fprintf(out, "build            %s  %s  %s", b.Digest, formatSize(b.SizeBytes), b.Created.Local().Format("2006-01-02 15:04:05"))
	if t.Stale {
		fmt.Fprintf(out, "  STALE: built from declaration %s", b.Declaration)
	}
	fmt.Fprintf(out, "\nkey              %s\n\n", b.Key)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KIND\tNAME\tVERSION\tHASH")
	for _, p := range b.SBOM.Debian {
		fmt.Fprintf(w, "debian\t%s\t%s\t-\n", p.Name, p.Version)
	}
	for _, p := range b.SBOM.Wheels {
		fmt.Fprintf(w, "wheel\t%s\t%s\tsha256:%s\n", p.Name, p.Version, p.SHA256)
	}
	for _, p := range b.SBOM.NPM {
		fmt.Fprintf(w, "npm\t%s\t%s\t%s\n", p.Name, p.Version, p.Integrity)
	}
	for _, p := range b.SBOM.Files {
		fmt.Fprintf(w, "file\t%s\t-\tsha256:%s\n", p.Target, p.SHA256)
	}
	_ = w.Flush()
	fmt.Fprintf(out, "\n%s added (of %d in the image), %s, %s, %s\n", plural(len(b.SBOM.Debian), "Debian package"),
		len(b.SBOM.Packages), plural(len(b.SBOM.Wheels), "wheel"), plural(len(b.SBOM.NPM), "npm package"), plural(len(b.SBOM.Files), "file"))
}

func templateBuild(ctx context.Context, args []string) int {
	f := newTemplateFlags("build", true)
	pull := f.fs.Bool("pull", false, "resolve the packages again even if the declaration was built before")
	verbose := f.fs.Bool("v", false, "show the output of apt-get and of the build sandbox (here only)")
	pos, err := f.parse(args, 1, 1)
	if err != nil {
		return report(err, *f.asJSON)
	}
	if f.remote.url != "" {
		return templateBuildRemote(ctx, f, pos[0], *pull)
	}
	set, err := f.catalog()
	if err != nil {
		return report(err, *f.asJSON)
	}
	t, err := set.Get(pos[0])
	if err != nil {
		return report(usageError{err}, *f.asJSON)
	}
	show := progressPrinter(os.Stderr, 5*time.Second)
	opts := image.TemplateOptions{Sources: templateSources(f.cfg), Pull: *pull, RunscPath: f.cfg.RunscPath, StateDir: filepath.Join(f.cfg.StateDir, "template-builds"),
		Progress: func(p image.Progress) {
			if p.Stage != "" {
				show(p)
			}
		}}
	if *verbose {
		opts.Log = os.Stderr
	}
	b := templatejobs.StoreBuilder{Store: openImages(f.cfg.ImageDir()), Options: opts}
	start := time.Now()
	built, hit, err := b.Build(ctx, t, *pull, opts.Progress)
	if err != nil {
		return report(classifyBuild(err), *f.asJSON)
	}
	job := client.TemplateBuildJob{Template: t.Name, State: client.BuildDone, Pull: *pull, Build: &built, CacheHit: hit}
	if t.Golden {
		job.Golden = "cold: golden checkpoints are made by the daemon's builds (stockade template build --url URL)"
	}
	return finishBuild(job, time.Since(start), *f.asJSON)
}

// classifyBuild marks a build's errors that the declaration or the command
// line causes as bad input; the rest (a mirror out of reach, a full disk,
// a sandbox that fails) are failures.
func classifyBuild(err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return classifyEngine(err)
}

// finishBuild prints a build job's outcome and returns the exit status.
func finishBuild(j client.TemplateBuildJob, took time.Duration, asJSON bool) int {
	if asJSON {
		printJSON(j)
	}
	switch j.State {
	case client.BuildCancelled:
		if !asJSON {
			fmt.Fprintf(os.Stderr, "stockade: %s; the previous build still serves\n", j.Error.Message)
		}
		return exitInterrupted
	case client.BuildFailed:
		if !asJSON {
			fmt.Fprintf(os.Stderr, "stockade: %s\n", j.Error.Message)
		}
		return exitFailure
	}
	if asJSON {
		return 0
	}
	b := j.Build
	how := "built in " + took.Round(100*time.Millisecond).String()
	if j.CacheHit {
		how = "unchanged: a cache hit"
	}
	fmt.Printf("%s: %s  %s  (%s)\n", j.Template, b.Digest, formatSize(b.SizeBytes), how)
	fmt.Printf("%s: %s, %s, %s, %s\n", j.Template, plural(len(b.SBOM.Debian), "Debian package"), plural(len(b.SBOM.Wheels), "wheel"),
		plural(len(b.SBOM.NPM), "npm package"), plural(len(b.SBOM.Files), "file"))
	if j.Golden != "" {
		fmt.Printf("%s: golden checkpoint: %s\n", j.Template, j.Golden)
	}
	return 0
}

// templateBuildRemote builds through the daemon of f: it starts the job
// (or joins the one running), prints its progress and its end. Ctrl-C
// cancels the job on the daemon before it exits 130.
func templateBuildRemote(ctx context.Context, f *templateFlags, name string, pull bool) int {
	c, err := f.remote.client()
	if err != nil {
		return report(err, *f.asJSON)
	}
	start := time.Now()
	job, err := c.BuildTemplate(ctx, name, client.BuildRequest{Pull: pull})
	if err != nil {
		return report(remoteErr(ctx, err), *f.asJSON)
	}
	if job.Joined {
		fmt.Fprintf(os.Stderr, "stockade: a build of %s is running already (job %s): following it\n", name, job.ID)
	}
	s, err := c.WatchTemplateBuild(ctx, name, job.ID)
	if err != nil {
		return report(cancelBuild(ctx, c, job, remoteErr(ctx, err)), *f.asJSON)
	}
	defer s.Close()
	show := progressPrinter(os.Stderr, 5*time.Second)
	for {
		ev, err := s.Next()
		if err != nil {
			return report(cancelBuild(ctx, c, job, remoteErr(ctx, err)), *f.asJSON)
		}
		if ev.Final() {
			return finishBuild(ev.Job, time.Since(start), *f.asJSON)
		}
		p := ev.Progress
		if p.Stage == "" {
			continue
		}
		show(image.Progress{Runtime: name, Stage: p.Stage, Packages: p.Packages, Total: p.Total, Bytes: p.Bytes,
			Elapsed: time.Duration(p.ElapsedMS) * time.Millisecond})
	}
}

// cancelBuild cancels the job on the daemon when ctx has ended (Ctrl-C),
// and returns err, saying so.
func cancelBuild(ctx context.Context, c *client.Client, job *client.TemplateBuildJob, err error) error {
	if ctx.Err() == nil {
		return err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, cerr := c.CancelTemplateBuild(cctx, job.Template, job.ID); cerr != nil {
		return fmt.Errorf("%w; cancelling build %s on the daemon failed too: %v", err, job.ID, cerr)
	}
	return fmt.Errorf("build %s of template %s cancelled; the previous build still serves: %w", job.ID, job.Template, ctx.Err())
}

func templateLint(args []string) int {
	f := newTemplateFlags("lint", false)
	pos, err := f.parse(args, 0, 1)
	if err != nil {
		return fail(err)
	}
	set, err := f.catalog()
	var ps templates.Problems
	if errors.As(err, &ps) {
		var lines []string
		for _, p := range ps {
			lines = append(lines, p.String())
		}
		return lintFailed(lines)
	}
	if err != nil {
		return fail(err)
	}
	list := set.Templates()
	if len(pos) == 1 {
		t, err := set.Get(pos[0])
		if err != nil {
			return fail(usageError{err})
		}
		list = []templates.Template{t}
	}
	problems, err := lintTemplates(f.cfg, set, list)
	if err != nil {
		return fail(err)
	}
	if len(problems) > 0 {
		return lintFailed(problems)
	}
	fmt.Printf("ok: %s\n", plural(len(list), "template"))
	return 0
}

// lintFailed prints problems, one a line, and returns exit status 1.
func lintFailed(problems []string) int {
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p)
	}
	fmt.Fprintf(os.Stderr, "stockade: templates refused: %s\n", plural(len(problems), "problem"))
	return exitFailure
}
