package templatejobs

import (
	"encoding/json"

	"github.com/stockade-sh/stockade/templates"
)

// Declaration is the template's canonical declaration (JSON) and its
// digest, which image.Manifest.Template.Declaration records of a build.
func Declaration(t templates.Template) (json.RawMessage, string) {
	return templates.Canonical(t), templates.Key(t)
}

// DeclarationKey is the digest of the template's declaration.
func DeclarationKey(t templates.Template) string { return templates.Key(t) }
