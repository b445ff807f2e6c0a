// Package npm resolves and installs npm packages for templates
// (docs/design.md, "Templates") without npm: Resolve reads the registry's
// documents and lays the packages and their dependencies out as npm's
// hoisted node_modules tree; Install downloads each tarball, checks its
// integrity and unpacks it, never outside node_modules.
//
// Neither runs a package's install scripts: Package.Scripts says a
// package has one (or a binding.gyp that npm would build), for the
// caller to refuse the package or run the script in a sandbox.
//
//	pkgs, err := npm.Resolve(ctx, "https://registry.npmjs.org", []string{"debug@4.3.4"})
//	err = npm.Install(ctx, "https://registry.npmjs.org", pkgs, tree, cacheDir) // tree/node_modules/debug, tree/node_modules/ms
package npm

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"
)

// Package is one package of a resolved tree.
type Package struct {
	// Name and Version are the package's ("@scope/name", "1.2.3").
	Name, Version string
	// Integrity is the tarball's digest in the registry's subresource
	// integrity form, "sha512-<base64>"; a package the registry gives no
	// integrity for has its sha1 shasum as "sha1-<base64>" (the registry's
	// oldest packages: sha1 is all there is to check them by).
	Integrity string
	// Resolved is the tarball's URL.
	Resolved string
	// Path is where the package goes under node_modules: "debug", or
	// "a/node_modules/b" when b is nested under a.
	Path string
	// Scripts is true when the package has a preinstall, install or
	// postinstall script, or a binding.gyp (npm would run node-gyp): the
	// caller refuses it or runs the script in a sandbox; Install runs
	// none. Install also sets it when the unpacked package.json shows one
	// the registry's document did not.
	Scripts bool
}

// integrityOf picks a manifest's strongest digest.
func integrityOf(m *manifest) (string, error) {
	best, rank := "", 0
	for _, f := range strings.Fields(m.Integrity) {
		algo, sum, ok := strings.Cut(f, "-")
		if !ok {
			continue
		}
		if i := strings.IndexByte(sum, '?'); i >= 0 {
			sum = sum[:i] // options of subresource integrity, unused
		}
		r := map[string]int{"sha512": 4, "sha384": 3, "sha256": 2}[algo]
		if b, err := base64.StdEncoding.DecodeString(sum); err != nil || len(b) == 0 {
			continue
		}
		if r > rank {
			best, rank = algo+"-"+sum, r
		}
	}
	if best != "" {
		return best, nil
	}
	if b, err := hex.DecodeString(m.Shasum); err == nil && len(b) == 20 {
		return "sha1-" + base64.StdEncoding.EncodeToString(b), nil
	}
	return "", errors.New("the registry gives no integrity or shasum for its tarball")
}
