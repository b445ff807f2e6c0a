package image

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/npm"
)

// scriptTimeout bounds one npm package's install scripts.
const scriptTimeout = 10 * time.Minute

func (s *Store) npmCacheDir() string { return filepath.Join(s.root, "cache", "npm") }

// installNPM resolves the template's npm packages and their dependencies
// on the registry, unpacks them into the tree's /node_modules (which node
// resolves from every directory) and, if the template allows them, runs
// their install scripts in a build sandbox without network. A package
// with install scripts in a template that does not allow them is an
// error naming it.
func (b *templateBuild) installNPM(ctx context.Context, rootfs string) ([]TemplateNPM, error) {
	pkgs, err := npm.Resolve(ctx, b.opts.Sources.NPMRegistry, b.t.NPMPackages)
	if err != nil {
		return nil, err
	}
	if err := b.refuseScripts(pkgs); err != nil {
		return nil, err
	}
	b.prog.packages(0, len(pkgs))
	if err := npm.Install(ctx, b.opts.Sources.NPMRegistry, pkgs, rootfs, b.s.npmCacheDir()); err != nil {
		return nil, err
	}
	b.prog.packages(len(pkgs), len(pkgs))
	// Install finds scripts the registry's documents did not show.
	if err := b.refuseScripts(pkgs); err != nil {
		return nil, err
	}
	if err := b.runScripts(ctx, rootfs, pkgs); err != nil {
		return nil, err
	}
	out := make([]TemplateNPM, 0, len(pkgs))
	for _, p := range pkgs {
		out = append(out, TemplateNPM{Name: p.Name, Version: p.Version, Integrity: p.Integrity})
	}
	slices.SortFunc(out, func(a, b TemplateNPM) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Version, b.Version))
	})
	return slices.CompactFunc(out, func(a, b TemplateNPM) bool { return a == b }), nil
}

// refuseScripts reports the first package with install scripts unless
// the template allows them.
func (b *templateBuild) refuseScripts(pkgs []npm.Package) error {
	if b.t.NPMScripts {
		return nil
	}
	for _, p := range pkgs {
		if p.Scripts {
			return errdefs.Publicf("npm_packages: %s@%s has install scripts, which this template does not run; set npm_scripts: true to run them in the build sandbox (without network), or choose another package: %w", p.Name, p.Version, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// installScripts are the package.json scripts npm runs when it installs a
// package, in order.
var installScripts = []string{"preinstall", "install", "postinstall"}

// runScripts runs the install scripts of the packages that have them, the
// most deeply nested (dependencies) first, each with /bin/sh in a build
// sandbox over the tree, writable, without network, in the package's
// directory, with node_modules/.bin directories on PATH as npm has them.
func (b *templateBuild) runScripts(ctx context.Context, rootfs string, pkgs []npm.Package) error {
	var todo []npm.Package
	for _, p := range pkgs {
		if p.Scripts {
			todo = append(todo, p)
		}
	}
	slices.SortStableFunc(todo, func(a, b npm.Package) int {
		return cmp.Or(-cmp.Compare(strings.Count(a.Path, "/node_modules/"), strings.Count(b.Path, "/node_modules/")), strings.Compare(a.Path, b.Path))
	})
	if len(todo) == 0 {
		return nil
	}
	// The scripts run as root in the tree: between two of them, only an
	// os.Root of it reads it (see readTreeFile).
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("opening %s: %w", rootfs, classify(err))
	}
	defer root.Close()
	for _, p := range todo {
		dir := "/node_modules/" + p.Path
		scripts, err := packageScripts(root, strings.TrimPrefix(dir, "/"))
		if err != nil {
			return errdefs.Publicf("npm_packages: %s@%s: its package.json cannot be read: %w", p.Name, p.Version, errdefs.ErrInvalidArgument)
		}
		for _, name := range installScripts {
			script := scripts[name]
			if script == "" {
				continue
			}
			if err := b.runScript(ctx, rootfs, p, dir, name, script); err != nil {
				return err
			}
		}
	}
	return nil
}

// packageScripts reads the scripts of the package.json in dir, relative
// to root: a regular file of at most maxPackageJSONBytes. A package with a
// binding.gyp and no install script gets npm's "node-gyp rebuild".
func packageScripts(root *os.Root, dir string) (map[string]string, error) {
	data, err := readTreeFile(root, path.Join(dir, "package.json"), maxPackageJSONBytes)
	if err != nil {
		return nil, err
	}
	var pj struct {
		Scripts map[string]any `json:"scripts"`
	}
	if err := json.Unmarshal(data, &pj); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, name := range installScripts {
		if s, ok := pj.Scripts[name].(string); ok {
			out[name] = s
		}
	}
	if _, err := root.Lstat(path.Join(dir, "binding.gyp")); err == nil && out["install"] == "" && out["preinstall"] == "" {
		out["install"] = "node-gyp rebuild"
	}
	return out, nil
}

// runScript runs one install script of p.
func (b *templateBuild) runScript(ctx context.Context, rootfs string, p npm.Package, dir, name, script string) error {
	var bins []string
	for d := dir; d != "/"; d = path.Dir(d) {
		if path.Base(d) == "node_modules" {
			continue
		}
		bins = append(bins, path.Join(d, "node_modules/.bin"))
	}
	bins = append(bins, "/node_modules/.bin", "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
	tail := &tailWriter{max: 16 << 10}
	var out io.Writer = tail
	if b.opts.Log != nil {
		out = io.MultiWriter(b.opts.Log, tail)
	}
	box := b.box(rootfs, true)
	box.Args = []string{"/bin/sh", "-c", script}
	box.Env = []string{"PATH=" + strings.Join(bins, ":"), "HOME=/tmp", "LC_ALL=C",
		"npm_lifecycle_event=" + name, "npm_package_name=" + p.Name, "npm_package_version=" + p.Version,
		"npm_config_ignore_scripts=", "CI=true"}
	box.Cwd = dir
	box.Timeout = scriptTimeout
	box.Out = out
	err := box.run(ctx)
	var ee *exitError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return err
	case errors.Is(err, errBoxTimeout):
		return errdefs.Publicf("npm_packages: the %s script of %s@%s did not finish within %v: %w", name, p.Name, p.Version, scriptTimeout, errdefs.ErrInvalidArgument)
	case errors.As(err, &ee):
		return errdefs.Publicf("npm_packages: the %s script of %s@%s failed (exit status %d): %s: %w", name, p.Name, p.Version, ee.code, tail.lastLines(5), errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("running the %s script of %s@%s: %w", name, p.Name, p.Version, err)
}
