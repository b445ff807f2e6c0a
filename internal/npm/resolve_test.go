package npm_test

import (
	"archive/tar"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/npm"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// layout is a resolution as "path=version" strings, in path order.
func layout(pkgs []npm.Package) string {
	var s []string
	for _, p := range pkgs {
		s = append(s, p.Path+"="+p.Version)
	}
	return strings.Join(s, " ")
}

// node returns Debian's node, which the tests run against the trees
// Install makes (CI installs nodejs).
func nodeBinary(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/node"); err != nil {
		testenv.Missing(t, "/usr/bin/node not found (apt-get install nodejs)")
	}
	return "/usr/bin/node"
}

// runNode runs script as root/tmp/t.js with node, from another working
// directory and without NODE_PATH, so that require finds packages only by
// walking up from the script to root/node_modules, as it will in an image.
func runNode(t *testing.T, root, script string) string {
	t.Helper()
	node := nodeBinary(t)
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	js := filepath.Join(root, "tmp", "t.js")
	if err := os.WriteFile(js, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, js)
	cmd.Dir = t.TempDir()
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + cmd.Dir}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", js, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestResolveLayout checks the hoisted layout: packages as high as they
// go, a conflicting version nested under its dependent, never where it
// would hide the version another package already found, and cycles; then
// installs it and has node require through it.
func TestResolveLayout(t *testing.T) {
	reg := newRegistry(t,
		fakePkg{name: "c", version: "1.0.0"},
		fakePkg{name: "c", version: "1.5.0"},
		fakePkg{name: "c", version: "2.0.0"},
		fakePkg{name: "c", version: "2.1.0-beta.1"},
		fakePkg{name: "d", version: "1.0.0"},
		fakePkg{name: "d", version: "2.0.0", deps: map[string]string{"c": "^2.0.0"}},
		// a finds c@1 at the top; its d@2 is nested under it, and d's
		// c@2 cannot go to a/node_modules, where a would find it.
		fakePkg{name: "a", version: "1.0.0", deps: map[string]string{"c": "^1.0.0", "d": "^2"}, files: map[string]string{
			"index.js": "module.exports = {self: 'a', c: require('c'), d: require('d')};\n"}},
		fakePkg{name: "b", version: "1.0.0", deps: map[string]string{"c": "2.x"}, files: map[string]string{
			"index.js": "module.exports = {self: 'b', c: require('c')};\n"}},
		// x and y need each other.
		fakePkg{name: "x", version: "1.0.0", deps: map[string]string{"y": "^1.0.0"}},
		fakePkg{name: "y", version: "1.0.0", deps: map[string]string{"x": "~1.0.0"}},
	)
	// c's latest is 2.1.0-beta.1 (the last listed), which no range here
	// names: a's ^1.0.0 takes 1.5.0, b's 2.x and d's ^2.0.0 take 2.0.0.
	pkgs, err := npm.Resolve(context.Background(), reg.URL, []string{"a@1.0.0", "b@1.0.0", "d@1.0.0", "x@1.0.0"})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	want := "a=1.0.0 a/node_modules/d=2.0.0 a/node_modules/d/node_modules/c=2.0.0 b=1.0.0 b/node_modules/c=2.0.0 c=1.5.0 d=1.0.0 x=1.0.0 y=1.0.0"
	if got := layout(pkgs); got != want {
		t.Errorf("Resolve layout:\n got %s\nwant %s", got, want)
	}
	if n := reg.count("/c"); n != 1 {
		t.Errorf("c's document fetched %d times, want once", n)
	}

	root := t.TempDir()
	if err := npm.Install(context.Background(), reg.URL, pkgs, root, t.TempDir()); err != nil {
		t.Fatalf("Install: %v", err)
	}
	out := runNode(t, root, `const a = require('a'), b = require('b');
console.log(a.c, a.d, b.c, require('c'), require('d'), require('x'));`)
	if want := "c@1.5.0 d@2.0.0 c@2.0.0 c@1.5.0 d@1.0.0 x@1.0.0"; out != want {
		t.Errorf("node: %q, want %q", out, want)
	}
	st, err := os.Stat(filepath.Join(root, "node_modules/a/node_modules/d/index.js"))
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("a nested file: %v, %v; want mode 0644", st, err)
	}
}

// TestResolveChoice checks which version a range chooses: the latest tag
// when it is in range, else the highest; deprecated versions only when
// all in range are; prereleases only when named; dist-tags as specs.
func TestResolveChoice(t *testing.T) {
	reg := newRegistry(t,
		fakePkg{name: "p", version: "1.0.0"},
		fakePkg{name: "p", version: "1.2.0"},
		fakePkg{name: "p", version: "1.3.0-rc.1"},
		fakePkg{name: "p", version: "1.1.0"}, // latest
		fakePkg{name: "q", version: "1.0.0"},
		fakePkg{name: "q", version: "2.0.0"},
		fakePkg{name: "q", version: "1.5.0"}, // latest
		fakePkg{name: "top1", version: "1.0.0", deps: map[string]string{"p": "^1.0.0"}},
		fakePkg{name: "top2", version: "1.0.0", deps: map[string]string{"q": ">=1.6"}},
		fakePkg{name: "top3", version: "1.0.0", deps: map[string]string{"r": "latest", "s": "^1.3.0-rc.0"}},
		fakePkg{name: "r", version: "3.0.0"},
		fakePkg{name: "s", version: "1.3.0-rc.2"},
		// Deprecated versions are chosen last.
		fakePkg{name: "top4", version: "1.0.0", deps: map[string]string{"u": "^1.0.0", "w": "*"}},
		fakePkg{name: "u", version: "1.0.0"},
		fakePkg{name: "u", version: "1.2.0", deprecated: "broken"},
		fakePkg{name: "u", version: "1.1.0", deprecated: "broken"}, // latest
		fakePkg{name: "w", version: "1.0.0", deprecated: "old"},
		fakePkg{name: "w", version: "2.0.0", deprecated: "old"},
	)
	pkgs, err := npm.Resolve(context.Background(), reg.URL, []string{"top1@1.0.0", "top2@1.0.0", "top3@1.0.0", "top4@1.0.0"})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if got, want := layout(pkgs), "p=1.1.0 q=2.0.0 r=3.0.0 s=1.3.0-rc.2 top1=1.0.0 top2=1.0.0 top3=1.0.0 top4=1.0.0 u=1.0.0 w=2.0.0"; got != want {
		t.Errorf("Resolve layout:\n got %s\nwant %s", got, want)
	}
}

// TestResolveOptionalPeer checks optional dependencies (installed when
// they can be, skipped when not) and peer dependencies (never installed;
// an error when missing unless optional).
func TestResolveOptionalPeer(t *testing.T) {
	reg := newRegistry(t,
		fakePkg{name: "fsevents", version: "2.3.3", os: []string{"darwin"}},
		fakePkg{name: "fine", version: "1.0.0", os: []string{"!win32"}},
		fakePkg{name: "host", version: "1.0.0"},
		fakePkg{name: "opt", version: "1.0.0", optional: map[string]string{"fsevents": "^2", "fine": "^1", "gone": "^1"}},
		fakePkg{name: "plugin", version: "1.0.0", peer: map[string]string{"host": "^1.0.0", "extra": "*"}, peerOptional: []string{"extra"}},
		fakePkg{name: "mac", version: "1.0.0", os: []string{"darwin"}},
		fakePkg{name: "needsmac", version: "1.0.0", deps: map[string]string{"mac": "1"}},
	)
	ctx := context.Background()
	pkgs, err := npm.Resolve(ctx, reg.URL, []string{"opt@1.0.0", "plugin@1.0.0", "host@1.0.0"})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if got, want := layout(pkgs), "fine=1.0.0 host=1.0.0 opt=1.0.0 plugin=1.0.0"; got != want {
		t.Errorf("Resolve layout:\n got %s\nwant %s", got, want)
	}
	for _, tt := range []struct {
		specs []string
		want  string
		class func(error) bool
	}{
		{[]string{"plugin@1.0.0"}, `npm_packages: "plugin@1.0.0": plugin@1.0.0 needs the peer dependency host@^1.0.0, which is not installed: add it to npm_packages`, errdefs.IsFailedPrecondition},
		{[]string{"needsmac@1.0.0"}, `npm_packages: "needsmac@1.0.0": mac@1.0.0 is not for linux/x64/glibc`, errdefs.IsInvalidArgument},
		{[]string{"mac@1.0.0"}, `npm_packages: "mac@1.0.0": mac@1.0.0 is not for linux/x64/glibc`, errdefs.IsInvalidArgument},
	} {
		_, err := npm.Resolve(ctx, reg.URL, tt.specs)
		if msg, _ := errdefs.PublicMessage(err); !strings.Contains(msg, tt.want) || !tt.class(err) {
			t.Errorf("Resolve(%v): %v; want %q", tt.specs, err, tt.want)
		}
	}
}

// TestResolveRefuses checks Resolve's errors, each naming the
// template's spec.
func TestResolveRefuses(t *testing.T) {
	reg := newRegistry(t,
		fakePkg{name: "left-pad", version: "1.3.0"},
		fakePkg{name: "gitdep", version: "1.0.0", deps: map[string]string{"x": "git+https://example.com/x.git"}},
		fakePkg{name: "nomatch", version: "1.0.0", deps: map[string]string{"left-pad": "^9.0.0"}},
		fakePkg{name: "missingdep", version: "1.0.0", deps: map[string]string{"absent": "^1.0.0"}},
		fakePkg{name: "badname", version: "1.0.0", deps: map[string]string{"../../etc": "^1.0.0"}},
	)
	tests := []struct {
		specs []string
		want  string
		class func(error) bool
	}{
		{[]string{"left-pad@9.9.9"}, `npm_packages: "left-pad@9.9.9": no such version`, errdefs.IsNotFound},
		{[]string{"absent@1.0.0"}, `npm_packages: "absent@1.0.0": absent: no such package on the npm registry`, errdefs.IsNotFound},
		{[]string{"left-pad@^1.3.0"}, `npm_packages: "left-pad@^1.3.0": want an exact version such as 1.2.3`, errdefs.IsInvalidArgument},
		{[]string{"left-pad"}, `npm_packages: "left-pad": want name@version`, errdefs.IsInvalidArgument},
		{[]string{"left-pad@latest"}, "want an exact version", errdefs.IsInvalidArgument},
		{[]string{"Bad Name@1.0.0"}, "is not an npm package name", errdefs.IsInvalidArgument},
		{[]string{"left-pad@1.3.0", "left-pad@1.3.0"}, "name the same package", errdefs.IsInvalidArgument},
		{[]string{"gitdep@1.0.0"}, `npm_packages: "gitdep@1.0.0": x@git+https://example.com/x.git (needed by gitdep@1.0.0): packages from URLs or git repositories are not supported`, errdefs.IsInvalidArgument},
		{[]string{"nomatch@1.0.0"}, `npm_packages: "nomatch@1.0.0": left-pad@^9.0.0 (needed by nomatch@1.0.0): no version matches`, errdefs.IsNotFound},
		{[]string{"missingdep@1.0.0"}, `npm_packages: "missingdep@1.0.0": absent@^1.0.0 (needed by missingdep@1.0.0): no such package on the npm registry`, errdefs.IsNotFound},
		{[]string{"badname@1.0.0"}, `"../../etc" is not an npm package name`, errdefs.IsInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.specs, ","), func(t *testing.T) {
			pkgs, err := npm.Resolve(context.Background(), reg.URL, tt.specs)
			msg, public := errdefs.PublicMessage(err)
			if !public || !strings.Contains(msg, tt.want) || !tt.class(err) {
				t.Errorf("Resolve = %v, %v (public %v); want a public error of its class containing %q", layout(pkgs), err, public, tt.want)
			}
		})
	}
}

// TestInstallRefuses checks tarballs Install refuses: an integrity that
// differs, entries escaping the package, devices, a package.json of
// another package; and that links are skipped and nothing is left of a
// refused install.
func TestInstallRefuses(t *testing.T) {
	tests := []struct {
		name string
		pkg  fakePkg
		want string
	}{
		{"integrity", fakePkg{badIntegrity: true}, "its tarball does not have the integrity the registry gives"},
		{"traversal", fakePkg{entries: []tarEntry{{name: "package/../../../evil.js", body: "x"}}}, `entry "package/../../../evil.js" of its tarball points outside the package`},
		{"absolute", fakePkg{entries: []tarEntry{{name: "/etc/evil", body: "x"}}}, "is an absolute path"},
		{"device", fakePkg{entries: []tarEntry{{name: "package/null", typ: tar.TypeChar}}}, "is a device or a fifo"},
		{"package.json", fakePkg{pjName: "other"}, "its package.json says other@1.0.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.pkg
			p.name, p.version = "victim", "1.0.0"
			reg := newRegistry(t, fakePkg{name: "first", version: "1.0.0"}, p)
			pkgs, err := npm.Resolve(context.Background(), reg.URL, []string{"first@1.0.0", "victim@1.0.0"})
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			root := t.TempDir()
			cache := t.TempDir()
			err = npm.Install(context.Background(), reg.URL, pkgs, root, cache)
			msg, public := errdefs.PublicMessage(err)
			if !public || !strings.HasPrefix(msg, "npm_packages: victim@1.0.0: ") || !strings.Contains(msg, tt.want) {
				t.Errorf("Install: %v; want a public error containing %q", err, tt.want)
			}
			left, _ := os.ReadDir(root)
			if len(left) != 0 {
				t.Errorf("a refused install left %v", left)
			}
			if tt.name == "integrity" {
				// Only tarballs of their digest are kept: first's, if its
				// fetch was not cancelled first.
				cached, _ := filepath.Glob(filepath.Join(cache, "*"))
				for _, c := range cached {
					b, _ := os.ReadFile(c)
					sum := sha512.Sum512(b)
					if filepath.Base(c) != "sha512-"+hex.EncodeToString(sum[:])+".tgz" {
						t.Errorf("cache holds %s, which is not of its digest", filepath.Base(c))
					}
				}
			}
		})
	}
}

// TestInstallLinksAndScripts checks that links in a tarball are not
// unpacked (npm does not unpack them), that modes are normalized, and
// that install scripts and binding.gyp set Scripts.
func TestInstallLinksAndScripts(t *testing.T) {
	reg := newRegistry(t,
		fakePkg{name: "links", version: "1.0.0", files: map[string]string{"bin/cli.js": "#!/usr/bin/env node\n"}, entries: []tarEntry{
			{name: "package/out", typ: tar.TypeSymlink, link: "/etc/passwd"},
			{name: "package/hard", typ: tar.TypeLink, link: "package/package.json"},
			{name: "package/run.sh", body: "#!/bin/sh\n", mode: 0o4777},
		}},
		fakePkg{name: "scripted", version: "1.0.0", scripts: map[string]string{"postinstall": "node x.js"}, hasInstallScript: true},
		fakePkg{name: "gyp", version: "1.0.0", files: map[string]string{"binding.gyp": "{}"}},
	)
	pkgs, err := npm.Resolve(context.Background(), reg.URL, []string{"links@1.0.0", "scripted@1.0.0", "gyp@1.0.0"})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	scripts := map[string]bool{}
	for _, p := range pkgs {
		scripts[p.Name] = p.Scripts
	}
	if fmt.Sprint(scripts) != "map[gyp:false links:false scripted:true]" {
		t.Errorf("Resolve's Scripts: %v, want scripted only (the registry does not say gyp has one)", scripts)
	}
	root := t.TempDir()
	if err := npm.Install(context.Background(), reg.URL, pkgs, root, t.TempDir()); err != nil {
		t.Fatalf("Install: %v", err)
	}
	for _, p := range pkgs {
		scripts[p.Name] = p.Scripts
	}
	if fmt.Sprint(scripts) != "map[gyp:true links:false scripted:true]" {
		t.Errorf("Install's Scripts: %v, want gyp and scripted", scripts)
	}
	dir := filepath.Join(root, "node_modules", "links")
	for _, name := range []string{"out", "hard"} {
		if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("link %s was unpacked: %v", name, err)
		}
	}
	st, err := os.Stat(filepath.Join(dir, "run.sh"))
	if err != nil || st.Mode() != 0o755 {
		t.Errorf("run.sh: %v, %v; want mode 0755 (no setuid)", st, err)
	}
	st, err = os.Stat(filepath.Join(dir, "bin"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("bin: %v, %v; want a 0755 directory", st, err)
	}
	if out := runNode(t, root, "console.log(require('links'), require('gyp'))"); out != "links@1.0.0 gyp@1.0.0" {
		t.Errorf("node: %q", out)
	}
}

// TestResolveScoped resolves and installs scoped packages, whose
// documents are fetched as @scope%2fname and which unpack under
// node_modules/@scope/.
func TestResolveScoped(t *testing.T) {
	reg := newRegistry(t,
		fakePkg{name: "@acme/util", version: "1.2.0"},
		fakePkg{name: "@acme/lib", version: "1.0.0", deps: map[string]string{"@acme/util": "^1.0.0"}, files: map[string]string{
			"index.js": "module.exports = 'lib with ' + require('@acme/util');\n"}},
	)
	pkgs, err := npm.Resolve(context.Background(), reg.URL, []string{"@acme/lib@1.0.0"})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if got, want := layout(pkgs), "@acme/lib=1.0.0 @acme/util=1.2.0"; got != want {
		t.Errorf("Resolve layout: got %s, want %s", got, want)
	}
	root := t.TempDir()
	if err := npm.Install(context.Background(), reg.URL, pkgs, root, t.TempDir()); err != nil {
		t.Fatalf("Install: %v", err)
	}
	if out := runNode(t, root, "console.log(require('@acme/lib'))"); out != "lib with @acme/util@1.2.0" {
		t.Errorf("node: %q", out)
	}
}

// TestResolveOrder checks that dependencies are resolved in npm's order
// (shallowest packages first, then by path), whatever the order of the
// template's list: it decides which version of a shared dependency is
// hoisted. With jest and eslint the tree is npm 11's, package for
// package.
func TestResolveOrder(t *testing.T) {
	reg := newRegistry(t,
		fakePkg{name: "shared", version: "1.0.0"},
		fakePkg{name: "shared", version: "2.0.0"},
		fakePkg{name: "z", version: "1.0.0", deps: map[string]string{"shared": "^1.0.0"}},
		fakePkg{name: "a", version: "1.0.0", deps: map[string]string{"shared": "^2.0.0"}},
	)
	for _, specs := range [][]string{{"z@1.0.0", "a@1.0.0"}, {"a@1.0.0", "z@1.0.0"}} {
		pkgs, err := npm.Resolve(context.Background(), reg.URL, specs)
		if err != nil {
			t.Fatalf("Resolve(%v): %v", specs, err)
		}
		if got, want := layout(pkgs), "a=1.0.0 shared=2.0.0 z=1.0.0 z/node_modules/shared=1.0.0"; got != want {
			t.Errorf("Resolve(%v) layout: got %s, want %s", specs, got, want)
		}
	}
}

// TestInstallSHA1 checks the fallback for the registry's oldest packages,
// which have a sha1 shasum and no integrity: Resolve gives it as
// "sha1-<base64>", and Install checks the tarball against it.
func TestInstallSHA1(t *testing.T) {
	reg := newRegistry(t, fakePkg{name: "old", version: "0.1.0", sha1Only: true})
	pkgs, err := npm.Resolve(context.Background(), reg.URL, []string{"old@0.1.0"})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if len(pkgs) != 1 || !strings.HasPrefix(pkgs[0].Integrity, "sha1-") {
		t.Fatalf("Resolve = %+v, want a sha1 integrity", pkgs)
	}
	if err := npm.Install(context.Background(), reg.URL, pkgs, t.TempDir(), t.TempDir()); err != nil {
		t.Errorf("Install: %v", err)
	}
	bad := pkgs[0]
	bad.Integrity = "sha1-" + strings.Repeat("A", 27) + "="
	err = npm.Install(context.Background(), reg.URL, []npm.Package{bad}, t.TempDir(), t.TempDir())
	if msg, _ := errdefs.PublicMessage(err); !strings.Contains(msg, "npm_packages: old@0.1.0: its tarball does not have the integrity") {
		t.Errorf("Install with another sha1: %v", err)
	}
}
