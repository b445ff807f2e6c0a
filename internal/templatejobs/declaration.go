package templatejobs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"

	"github.com/stockade-sh/stockade/templates"
)

// Declaration is the template's canonical declaration (JSON) and its
// digest, as image.Manifest.Template.Declaration records it.
//
// TODO(tpl-decl): it stands in for templates.Canonical and templates.Key,
// as image's own stand-in does, and encodes the same way.
func Declaration(t templates.Template) (json.RawMessage, string) {
	t.Source = ""
	c := t
	c.DebianPackages = slices.Sorted(slices.Values(t.DebianPackages))
	c.NPMPackages = slices.Sorted(slices.Values(t.NPMPackages))
	c.PythonWheels = slices.Clone(t.PythonWheels)
	slices.SortFunc(c.PythonWheels, func(a, b templates.Wheel) int {
		return strings.Compare(a.File+"\x00"+a.Name+"\x00"+a.SHA256, b.File+"\x00"+b.Name+"\x00"+b.SHA256)
	})
	c.Files = slices.Clone(t.Files)
	slices.SortFunc(c.Files, func(a, b templates.File) int { return strings.Compare(a.Target, b.Target) })
	data, _ := json.Marshal(c)
	sum := sha256.Sum256(data)
	return data, "sha256:" + hex.EncodeToString(sum[:])
}

// DeclarationKey is the digest of the template's declaration.
func DeclarationKey(t templates.Template) string {
	_, k := Declaration(t)
	return k
}
