package engine

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/kernel"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/templates"
	"github.com/stockade-sh/stockade/tools"
)

// A tool whose record names a template (tools.Tool.Template) runs the
// template's image, built by image.Store.BuildTemplate, with the
// template's base as its only runtime: a request may name that runtime or
// none. The template's Env is added to the profile's environment of every
// program and kernel of its sandboxes; its Workdir is their working
// directory (a session's kernel otherwise runs in /workspace, a one-shot
// in /tmp); its Start, and then its Ready check, run before any code of a
// caller, where that code will run:
//
//   - a session: in its kernel, as hidden cells whose output is no one's,
//     once the kernel has started and again whenever the kernel is
//     restarted (after a timeout or an OOM kill), so that every cell of
//     the session finds what Start made; a Start or Ready that fails ends
//     the session's creation with an error naming the template;
//   - a session pool's sandbox: the same, before the pool holds it;
//   - a one-shot: in the program's own process, before the program, by a
//     loader that runs Start and Ready with their output discarded and
//     then the program where Start left its state. For python it is
//     pool.py, the loader of the python one-shot pools, which reads the
//     program from its stdin and runs it as __main__ in the namespace
//     Start filled; for node template.js (Start as a script in the global
//     scope, then the program as the main module); for shell template.sh
//     (Start evaluated in the shell, then the program sourced). A cold
//     one-shot pays for Start within its own timeout; a one-shot pool's
//     sandbox runs Start as it fills. A Start that fails ends the loader
//     with startFailedCode before any of the caller's code runs: the run
//     is an error, not a result of the caller's program.

// TemplateImages resolves a template's image: its rootfs and the
// manifest of its build (image.Store.ResolveTemplate). The engine's
// Images implement it where templates can run; an engine over images that
// do not refuses every tool that names a template.
type TemplateImages interface {
	ResolveTemplate(name string) (sandbox.Image, image.Manifest, error)
}

// startFailed is the exit status and the start of the stderr of pool.py
// when a template's Start or Ready failed, before the program was read.
const (
	startFailedCode   = 125
	startFailedPrefix = "stockade: the template's "
)

// templateSnapshotRefuses says why the sessions of the named tool cannot
// be snapshotted or forked, or nil: a template's Start may hold state of
// its own (tokens, seeded generators) that no reseed reaches, and every
// session restored from the snapshot would share it, so a template's
// tool is snapshotted only when the template opts in (golden: true), the
// rule pools and golden checkpoints follow (snapOf, MakeGolden).
func (e *Engine) templateSnapshotRefuses(name string) error {
	if name == "" {
		return nil
	}
	tool, err := e.tools.Get(name)
	if err != nil || tool.Template == "" {
		return nil
	}
	_, tm, err := e.templateOf(tool)
	if err != nil {
		return err
	}
	if !tm.Golden {
		return errdefs.Publicf("tool %q runs template %s, whose start may hold state no reseed reaches, and the template does not opt into checkpoints (golden: true), so its sessions cannot be snapshotted or forked: %w",
			tool.Name, tm.Name, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// templateOf resolves tool's template: its image and what it runs at a
// sandbox's start. A tool without one is (zero, nil, nil). A build of
// another declaration than the tool's record carries (a stale template)
// is a public ErrFailedPrecondition: the template must be built again.
func (e *Engine) templateOf(tool tools.Tool) (sandbox.Image, *image.TemplateManifest, error) {
	if tool.Template == "" {
		return sandbox.Image{}, nil, nil
	}
	ti, ok := e.images.(TemplateImages)
	if !ok {
		return sandbox.Image{}, nil, errdefs.Publicf("tool %q runs template %q, and this server's images hold no templates: %w", tool.Name, tool.Template, errdefs.ErrFailedPrecondition)
	}
	img, m, err := ti.ResolveTemplate(tool.Template)
	if err != nil {
		return sandbox.Image{}, nil, err
	}
	if m.Template == nil || m.Template.Name != tool.Template {
		return sandbox.Image{}, nil, fmt.Errorf("the image of template %q is not a build of it: %w", tool.Template, errdefs.ErrFailedPrecondition)
	}
	if _, ok := image.Runtimes[m.Template.Base]; !ok {
		return sandbox.Image{}, nil, fmt.Errorf("template %q has an unknown base %q: %w", tool.Template, m.Template.Base, errdefs.ErrFailedPrecondition)
	}
	// The build must be of the declaration the tool's record carries
	// (what its review saw): not an older one (a shrunk declaration needs
	// no review, and the old image would still hold what it dropped), nor
	// another built into the store by hand.
	if d, ok := tool.TemplateDeclaration(); !ok || m.Template.Declaration != templates.Key(d) {
		return sandbox.Image{}, nil, &staleError{template: tool.Template}
	}
	return img, m.Template, nil
}

// staleError is a template whose current build is of another declaration
// than the tool's record carries: ErrFailedPrecondition, its message fit
// for a client.
type staleError struct{ template string }

func (e *staleError) Error() string {
	return fmt.Sprintf("template %q is stale: its build is of another declaration; build it with `stockade template build %s`", e.template, e.template)
}

// Public says that its message is fit for a client (errdefs.Publicer).
func (e *staleError) Public() bool { return true }

func (e *staleError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// isStale says whether err is a stale template's.
func isStale(err error) bool {
	var s *staleError
	return errors.As(err, &s)
}

// templateRuntime is the runtime a request for runtime of tool runs: the
// base of its template, which the request may name or leave empty, or
// runtime for a tool without one.
func (e *Engine) templateRuntime(tool tools.Tool, runtime string) (string, error) {
	if tool.Template == "" {
		return runtime, nil
	}
	_, m, err := e.templateOf(tool)
	if err != nil {
		return "", err
	}
	if runtime != "" && runtime != m.Base {
		return "", errdefs.Publicf("tool %q runs template %q, whose runtime is %q, not %q: %w", tool.Name, m.Name, m.Base, runtime, errdefs.ErrInvalidArgument)
	}
	return m.Base, nil
}

// imageOf is the image a sandbox of tool with runtime rt runs: its
// template's, or the runtime's. The manifest is nil without a template.
func (e *Engine) imageOf(tool tools.Tool, rt image.Runtime) (sandbox.Image, *image.TemplateManifest, error) {
	if tool.Template != "" {
		return e.templateOf(tool)
	}
	img, err := e.images.Resolve(rt.Name)
	return img, nil, err
}

// templateEnv is the environment of a program or kernel of template m:
// the profile's, with m's variables added (replacing the profile's of the
// same name), in the order of their names. Nil m is the profile's.
func templateEnv(m *image.TemplateManifest) []string {
	env := ProgramEnv()
	if m == nil || len(m.Env) == 0 {
		return env
	}
	out := make([]string, 0, len(env)+len(m.Env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := m.Env[k]; !ok {
			out = append(out, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(m.Env)) {
		out = append(out, k+"="+m.Env[k])
	}
	return out
}

// sessionKernel is the kernel of a session of tool with runtime rt, and
// the hidden cells it runs before the session's first (and after each
// restart): its template's Start and Ready. preimport are modules the
// python kernel imports before it is ready (a session pool's).
func (e *Engine) sessionKernel(tool tools.Tool, rt image.Runtime, preimport []string) (sandbox.KernelSpec, *prelude, error) {
	_, m, err := e.imageOf(tool, rt)
	if err != nil {
		return sandbox.KernelSpec{}, nil, err
	}
	if e.testKernel {
		ks, err := e.kernelSpec(rt)
		return ks, newPrelude(m), err
	}
	opts := kernel.Options{Cwd: WorkspaceDir, Env: templateEnv(m), Preimport: preimport}
	if m != nil && m.Workdir != "" {
		opts.Cwd = m.Workdir
	}
	ks, err := kernel.Spec(rt.Name, opts)
	return ks, newPrelude(m), err
}

// prelude is what a template's kernel runs before a caller's cells.
type prelude struct {
	template     string
	start, ready string
}

func newPrelude(m *image.TemplateManifest) *prelude {
	if m == nil || (m.Start == "" && m.Ready == "") {
		return nil
	}
	return &prelude{template: m.Name, start: m.Start, ready: m.Ready}
}

// run runs the prelude's cells in k, their output discarded; a cell that
// fails is ErrFailedPrecondition naming the template, with the cell's
// error and the end of its stderr.
func (p *prelude) run(ctx context.Context, k sandbox.Kernel) error {
	if p == nil {
		return nil
	}
	for _, c := range []struct{ name, code string }{{"start", p.start}, {"ready", p.ready}} {
		if c.code == "" {
			continue
		}
		var stderr bytes.Buffer
		r, err := k.Run(ctx, sandbox.Cell{Code: c.code, OnOutput: func(s sandbox.Stream, b []byte) {
			if s == sandbox.Stderr && stderr.Len() < 4096 {
				stderr.Write(b)
			}
		}})
		if err != nil {
			return fmt.Errorf("running template %q's %s: %w", p.template, c.name, err)
		}
		if why := cellFailure(r, stderr.String()); why != "" {
			return errdefs.Publicf("template %q's %s failed: %s: %w", p.template, c.name, why, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// cellFailure says why a hidden cell failed, or "" when it succeeded.
func cellFailure(r *sandbox.CellResult, stderr string) string {
	switch {
	case r.Status == sandbox.CellRaised && r.Error != nil:
		return fmt.Sprintf("%s: %s", r.Error.Name, oneLine(r.Error.Value, 300))
	case r.Status != sandbox.CellOK:
		return fmt.Sprintf("status %s: %s", r.Status, oneLine(stderr, 300))
	}
	return ""
}

// oneLine is s on one line, at most n bytes of it.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

// loaderConfig is what pool.py runs before it reads the program: the
// modules it imports, the template's working directory, Start and Ready.
type loaderConfig struct {
	Preimport []string `json:"preimport"`
	Workdir   string   `json:"workdir,omitempty"`
	Start     string   `json:"start,omitempty"`
	Ready     string   `json:"ready,omitempty"`
}

// loaderArgv is the argv of pool.py for template m (nil: none) that
// imports preimport first.
func loaderArgv(m *image.TemplateManifest, preimport []string) []string {
	c := loaderConfig{Preimport: preimport}
	if c.Preimport == nil {
		c.Preimport = []string{}
	}
	if m != nil {
		c.Workdir, c.Start, c.Ready = m.Workdir, m.Start, m.Ready
	}
	b, _ := json.Marshal(c)
	return []string{"/usr/bin/python3", "-c", poolPython, string(b)}
}

// needsLoader says whether a one-shot of template m must run through a
// loader: it has Start, Ready or Workdir to apply.
func needsLoader(m *image.TemplateManifest) bool {
	return m != nil && (m.Start != "" || m.Ready != "" || m.Workdir != "")
}

var (
	//go:embed template.js
	nodeLoader string
	//go:embed template.sh
	shellLoader string
)

// loaderInterpreter is the argv of a one-shot of template m on runtime
// rt, node or shell, through its loader; the program is in the file of
// the Exec, its stdin the Exec's.
func loaderInterpreter(m *image.TemplateManifest, rt image.Runtime) []string {
	file := "/tmp/" + rt.FileName
	if rt.Name == "node" {
		b, _ := json.Marshal(loaderConfig{Workdir: m.Workdir, Start: m.Start, Ready: m.Ready})
		return []string{rt.Interpreter[0], "-e", nodeLoader, string(b), file}
	}
	// busybox's sh (the shell image) or the image's /bin/sh.
	sh := []string{"/bin/sh"}
	if rt.Name == "shell" {
		sh = rt.Interpreter[:2]
	}
	return append(sh, "-c", shellLoader, file, m.Workdir, m.Start, m.Ready)
}

// startFailure is the error of a loader's run that ended before the
// program because the template's Start or Ready failed, or nil.
func startFailure(template string, res *sandbox.Result) error {
	if res.ExitCode != startFailedCode || !bytes.HasPrefix(res.Stderr, []byte(startFailedPrefix)) {
		return nil
	}
	return errdefs.Publicf("template %q: %s: %w", template, oneLine(strings.TrimPrefix(string(res.Stderr), "stockade: "), 400), errdefs.ErrFailedPrecondition)
}

// runLoader runs req's program in sb, a fresh sandbox of template m,
// through pool.py: Start and Ready first, then the program, as a one-shot
// pool's sandbox runs it (runWarm) but within one Exec of the sandbox's
// timeout. A Start or Ready that failed is an error.
func (e *Engine) runLoader(ctx context.Context, sb *Sandbox, req Request, m *image.TemplateManifest) (*sandbox.Result, error) {
	ex, err := sb.Start(ctx, sandbox.ExecRequest{
		File:        sandbox.File{Name: sb.Runtime.FileName},
		Argv:        loaderArgv(m, nil),
		Env:         templateEnv(m),
		StdinStream: true,
		ExitNotice:  true,
		Timeout:     sb.Limits.Timeout,
		OnOutput:    req.OnOutput,
	})
	if err != nil {
		return nil, err
	}
	go feed(ex, sb.Runtime.FileName, req.Code, req.Stdin)
	res, err := ex.Wait(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	if err := startFailure(m.Name, res); err != nil {
		return nil, err
	}
	return res, nil
}
