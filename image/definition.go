package image

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
)

// hardenRevision stands for what harden does beyond its tables (clearing
// setuid bits, normalising /etc/shadow, checking the accounts). Bump it
// when that changes, so that Build rebuilds every image.
const hardenRevision = 1

// definition returns the digest of what an image of rt is built from: the
// Debian suite, rt's packages, interpreter and strip patterns, and the
// hardening every image gets (its tables and hardenRevision). The
// manifest records it (Manifest.Definition), so that Build can tell an
// image built from an older definition and rebuild it.
func (rt Runtime) definition() string {
	h := sha256.New()
	fmt.Fprintf(h, "name %q\nsuite %q\npackages %q\ninterpreter %q\nstrip %q\n", rt.Name, Suite, rt.Packages, rt.Interpreter, rt.Strip)
	fmt.Fprintf(h, "harden %d\nmount points %q\nemptied %q\nremoved %q\n", hardenRevision, mountPoints, emptied, removed)
	for _, w := range written {
		fmt.Fprintf(h, "written %q %q %o\n", w.name, w.data, w.perm)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// outdated says how the image of manifest m falls short of rt's current
// definition, or returns "" when it does not.
func outdated(m Manifest, rt Runtime) string {
	if m.Definition != "" {
		if m.Definition != rt.definition() {
			return "it was built from an older definition of the runtime"
		}
		return ""
	}
	// An image built before manifests recorded their definition: what can
	// be checked is that it has the packages and interpreter of today's.
	for _, p := range rt.Packages {
		if _, ok := m.Packages[p]; !ok {
			return fmt.Sprintf("package %s is not installed", p)
		}
	}
	if !slices.Equal(m.Interpreter, rt.Interpreter) {
		return fmt.Sprintf("its interpreter is %q, not %q", m.Interpreter, rt.Interpreter)
	}
	return ""
}
