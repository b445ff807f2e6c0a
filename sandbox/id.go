package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"

	"github.com/stockade-sh/stockade/errdefs"
)

// idPattern is what a sandbox ID must look like (at most MaxIDLength
// characters): it names directories, cgroups and containers. Lengths are
// checked apart from the pattern: a counted repetition compiles to a large
// program, at every start of the CLI.
var idPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// MaxIDLength bounds a sandbox ID.
const MaxIDLength = 64

// CheckID accepts a sandbox ID of 1 to MaxIDLength letters, digits, '_',
// '.' and '-', starting with a letter or a digit; anything else is
// ErrInvalidArgument. Every ID a driver uses, and every ID it reads back
// from its state, passes it.
func CheckID(id string) error {
	if len(id) > MaxIDLength || !idPattern.MatchString(id) {
		return fmt.Errorf("sandbox id %q is invalid: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// NewID returns a new random sandbox ID: "sbx-" and 16 hex digits.
func NewID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sbx-" + hex.EncodeToString(b[:])
}

// ResolveID is the ID a driver gives the sandbox of a Spec whose ID is
// requested: requested itself when it passes CheckID, a NewID when it is
// empty.
func ResolveID(requested string) (string, error) {
	if requested == "" {
		return NewID(), nil
	}
	if err := CheckID(requested); err != nil {
		return "", err
	}
	return requested, nil
}
