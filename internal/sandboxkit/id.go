package sandboxkit

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"

	"github.com/stockade-sh/stockade/errdefs"
)

// idPattern is what a sandbox ID must look like (at most 64 characters):
// it names directories, cgroups and containers. Lengths are checked apart
// from the pattern: a counted repetition compiles to a large program, at
// every start of the CLI.
var idPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// ID returns the ID of a new sandbox: requested (a Spec's ID) when it is
// set, else a random "sbx-" and 16 hex digits. A requested ID must be 1 to 64
// letters, digits, '_', '.' and '-', starting with a letter or a digit;
// otherwise ID fails with ErrInvalidArgument.
func ID(requested string) (string, error) {
	id := requested
	if id == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		id = "sbx-" + hex.EncodeToString(b[:])
	}
	if len(id) > 64 || !idPattern.MatchString(id) {
		return "", fmt.Errorf("sandbox id %q is invalid: %w", id, errdefs.ErrInvalidArgument)
	}
	return id, nil
}
