// Package clip bounds text that a sandbox chooses (a name, a path, a
// parameter, an error quoting them) before it goes into an audit event or
// a log line, so that a sandbox cannot make either large.
//
//	log.Info("egress refused", "name", clip.String(d.Name, clip.Name))
package clip

import (
	"fmt"
	"sync/atomic"
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

// MaxLines is how many refusal lines of one sandbox a component logs
// before it only counts them: as many as the refusals audited one by one
// (a sandbox makes refusals as fast as it opens connections).
const MaxLines = 100

// Lines passes the first MaxLines of a series of log lines and counts the
// rest, so that a sandbox refused as fast as it can ask does not flood
// the log. It is safe for concurrent use; the zero value is ready.
type Lines struct{ n atomic.Int64 }

// Pass counts one line and reports whether to log it.
func (l *Lines) Pass() bool { return l.n.Add(1) <= MaxLines }

// Suppressed returns how many lines Pass held back.
func (l *Lines) Suppressed() int64 { return max(0, l.n.Load()-MaxLines) }
