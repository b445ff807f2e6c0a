package image

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/npm"
	"github.com/stockade-sh/stockade/templates"
)

// TestBuildTemplateNPM builds a node template with a package from the npm
// registry, which its start requires, and refuses a package with install
// scripts in a template that does not allow them.
func TestBuildTemplateNPM(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping real template builds in -short mode")
	}
	requireTemplateBuild(t, "node")
	s, _ := templateStore(t, "node")
	tpl := templates.Template{Name: "web", Base: "node", NPMPackages: []string{"left-pad@1.3.0"},
		Start: "globalThis.lp = require('left-pad')", Ready: "if (lp('1', 3, '0') !== '001') throw new Error('bad pad')"}
	st := &stages{}
	opts := TemplateOptions{StateDir: t.TempDir(), Progress: st.progress}
	m, err := s.BuildTemplate(t.Context(), tpl, opts)
	if err != nil {
		t.Fatalf("BuildTemplate: %v", err)
	}
	if !slices.Contains(st.get(), "npm") {
		t.Errorf("stages %v lack npm", st.get())
	}
	if len(m.Template.NPM) != 1 || m.Template.NPM[0].Name != "left-pad" || m.Template.NPM[0].Version != "1.3.0" || !strings.HasPrefix(m.Template.NPM[0].Integrity, "sha") {
		t.Errorf("npm = %+v", m.Template.NPM)
	}
	img, _, err := s.ResolveTemplate("web")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(img.Rootfs, "node_modules/left-pad/package.json")); err != nil {
		t.Errorf("left-pad is not in /node_modules: %v", err)
	}

	scripted := tpl
	scripted.NPMPackages = []string{"core-js@3.37.1"}
	scripted.Start, scripted.Ready = "", ""
	_, err = s.BuildTemplate(t.Context(), scripted, opts)
	if msg, _ := errdefs.PublicMessage(err); !strings.HasPrefix(msg, "npm_packages: core-js@3.37.1 has install scripts") {
		t.Errorf("a package with install scripts: %v, want a public error naming it", err)
	}
	if now, _, err := s.ResolveTemplate("web"); err != nil || now.Digest != m.Digest {
		t.Errorf("after the failed build: %s, %v; want %s", now.Digest, err, m.Digest)
	}
}

// TestNPMScriptsRunInSandbox runs a package's install scripts in the
// build sandbox over a node tree: they run in order, in the package's
// directory, and find no network.
func TestNPMScriptsRunInSandbox(t *testing.T) {
	requireTemplateBuild(t, "node")
	img, err := Open(installedStore()).Resolve("node")
	if err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := copyTree(t.Context(), img.Rootfs, rootfs); err != nil {
		t.Fatal(err)
	}
	writeTree(t, rootfs, map[string]string{"node_modules/demo/package.json": `{"name": "demo", "version": "1.0.0", "scripts": {
		"preinstall": "pwd > pre.txt",
		"postinstall": "node -e \"require('net').connect(80, '1.1.1.1').on('connect', () => require('fs').writeFileSync('net.txt', 'connected')).on('error', e => require('fs').writeFileSync('net.txt', e.code))\""}}`})
	b := &templateBuild{t: templates.Template{NPMScripts: true}, opts: TemplateOptions{StateDir: t.TempDir()}, prog: newProgress(nil, "")}
	if err := b.runScripts(t.Context(), rootfs, []npm.Package{{Name: "demo", Version: "1.0.0", Path: "demo", Scripts: true}}); err != nil {
		t.Fatalf("runScripts: %v", err)
	}
	for file, want := range map[string]string{"pre.txt": "/node_modules/demo\n", "net.txt": "ENETUNREACH"} {
		got, err := os.ReadFile(filepath.Join(rootfs, "node_modules/demo", file))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", file, got, err, want)
		}
	}

	b.t.NPMScripts = false
	if err := b.refuseScripts([]npm.Package{{Name: "demo", Version: "1.0.0", Scripts: true}}); err == nil || !strings.Contains(err.Error(), "demo@1.0.0 has install scripts") {
		t.Errorf("refuseScripts without npm_scripts = %v", err)
	}
}

// FuzzPackageScripts reads a package.json as it comes from the registry.
func FuzzPackageScripts(f *testing.F) {
	f.Add([]byte(`{"scripts": {"postinstall": "node x.js", "test": "t"}}`))
	f.Add([]byte(`{"scripts": {"install": 3}}`))
	f.Add([]byte(`{"scripts": null}`))
	dir := f.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		f.Fatal(err)
	}
	defer root.Close()
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, "package.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		scripts, err := packageScripts(root, ".")
		if err != nil {
			return
		}
		for name := range scripts {
			if !slices.Contains(installScripts, name) {
				t.Errorf("packageScripts returned %q, not an install script", name)
			}
		}
	})
}
