// Package clip bounds text that a sandbox chooses (a name, a path, a
// parameter, an error quoting them) before it goes into an audit event or
// a log line, so that a sandbox cannot make either large.
//
//	log.Info("egress refused", "name", clip.String(d.Name, clip.Name))
package clip

import (
	"fmt"
	"unicode/utf8"
)

// Bounds for what a sandbox chooses, in bytes.
const (
	// Name bounds a name: a host, an operation, a path.
	Name = 256
	// Detail bounds a detail or an error quoting what the sandbox sent.
	Detail = 512
	// Reason bounds a reason that quotes what the sandbox sent.
	Reason = 1024
)

// String cuts s to at most n bytes, at a character boundary, and says how
// long it was.
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("... (%d bytes)", len(s))
}
