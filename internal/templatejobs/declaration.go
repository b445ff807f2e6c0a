package templatejobs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/stockade-sh/stockade/templates"
)

// Declaration is the template's canonical declaration (JSON) and its
// digest (templates.Canonical and templates.Key).
// TODO(tpl-decl): templates.Canonical and templates.Key once merged.
func Declaration(t templates.Template) (json.RawMessage, string) {
	t.Source = ""
	b, _ := json.Marshal(t)
	sum := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(sum[:])
}

// DeclarationKey is the digest of the template's declaration.
func DeclarationKey(t templates.Template) string {
	_, k := Declaration(t)
	return k
}
