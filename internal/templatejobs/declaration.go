package templatejobs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/stockade-sh/stockade/templates"
)

// declaration is the template's canonical declaration and its digest.
// TODO(tpl-decl): templates.Canonical and templates.Key once merged.
func declaration(t templates.Template) (json.RawMessage, string) {
	t.Source = ""
	b, _ := json.Marshal(t)
	sum := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(sum[:])
}

func declarationKey(t templates.Template) string {
	_, k := declaration(t)
	return k
}
