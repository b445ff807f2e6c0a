package sandbox

import (
	"path"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
)

// CheckCommand refuses an ExecRequest that a remote driver, which runs
// it as one command of its provider's API (no guest agent), cannot pass
// on as it is: streamed stdin, an argv[0] that is not an absolute path
// (or holds '='), a code file over MaxCodeSize or whose name is not a
// plain file name, an environment entry that is not KEY=value, a NUL
// anywhere. The error names driver and is of class ErrInvalidArgument.
func CheckCommand(driver string, req ExecRequest) error {
	bad := func(format string, a ...any) error {
		return errdefs.Publicf("%s: "+format+": %w", append(append([]any{driver}, a...), errdefs.ErrInvalidArgument)...)
	}
	switch {
	case req.StdinStream:
		return bad("the provider's commands take no streamed stdin")
	case len(req.Argv) == 0 || !path.IsAbs(req.Argv[0]) || strings.Contains(req.Argv[0], "="):
		return bad("argv[0] must be an absolute path without '='")
	case len(req.File.Data) > MaxCodeSize:
		return bad("the code file is larger than %d bytes", MaxCodeSize)
	case req.File.Name != "" && (strings.Contains(req.File.Name, "/") || req.File.Name == "." || req.File.Name == ".." || strings.ContainsRune(req.File.Name, 0)):
		return bad("code file name %q is not a plain file name", req.File.Name)
	}
	for _, kv := range req.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			return bad("environment entry %q is not KEY=value", kv)
		}
	}
	for _, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return bad("an argument holds a NUL")
		}
	}
	return nil
}
