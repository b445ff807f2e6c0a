// Package guestbin carries the stockade-guest binary inside the stockade
// binary, so that one file is all an operator installs. The build (make)
// compiles cmd/stockade-guest into payload/ before compiling stockade, and
// the probe of the blast-radius audit (sandbox/conformance/probe) beside it.
package guestbin

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/fsmode"
)

//go:embed all:payload
var payload embed.FS

const guestFile = "payload/stockade-guest"

// guestSum is the first 16 hex digits of the guest's SHA-256. The build
// (make guest) writes it beside the guest, so that the CLI, which installs
// the guest on every start, does not read and hash 2 MB each time (that
// cost milliseconds of every `stockade run`); without it the sum is
// computed here.
func guestSum() (string, error) {
	if b, err := fs.ReadFile(payload, guestFile+".sha256"); err == nil {
		if s := strings.TrimSpace(string(b)); len(s) >= 16 && isHex(s[:16]) {
			return s[:16], nil
		}
		return "", fmt.Errorf("%s.sha256 is malformed; rebuild with `make build`: %w", guestFile, errdefs.ErrFailedPrecondition)
	}
	b, err := fs.ReadFile(payload, guestFile)
	if err != nil {
		return "", fmt.Errorf("reading the embedded guest agent: %w", err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8]), nil
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

// Install writes the embedded guest into dir (once per content) and returns
// its path. The file is read-only (0555); its name carries the content hash,
// so a new build never overwrites a guest that running sandboxes use.
//
// dir is a directory of the data directory (its parent), which must exist:
// Install creates dir but never the data directory, so that a mistyped
// --data-dir fails without leaving a tree behind (`stockade setup` creates
// the data directory).
func Install(dir string) (string, error) {
	fi, err := fs.Stat(payload, guestFile)
	if err != nil {
		return "", fmt.Errorf("this stockade binary was built without the guest agent; build it with `make build`: %w", errdefs.ErrFailedPrecondition)
	}
	sum, err := guestSum()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("stockade-guest-%d-%s", fi.Size(), sum))
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	b, err := fs.ReadFile(payload, guestFile)
	if err != nil {
		return "", fmt.Errorf("reading the embedded guest agent: %w", err)
	}
	if h := sha256.Sum256(b); hex.EncodeToString(h[:8]) != sum {
		return "", fmt.Errorf("the embedded guest agent does not match its recorded hash; rebuild with `make build`: %w", errdefs.ErrFailedPrecondition)
	}
	// Sandboxes bind-mount the agent from their own user namespaces
	// (fsmode.Exceptions).
	if err := os.Mkdir(dir, fsmode.Traverse); err != nil && !errors.Is(err, fs.ErrExist) {
		if errors.Is(err, fs.ErrNotExist) {
			data := filepath.Dir(dir)
			return "", fmt.Errorf("the data directory %s does not exist; create it with `stockade setup --data-dir %s`, or name another with --data-dir: %w", data, data, errdefs.ErrInvalidArgument)
		}
		return "", fmt.Errorf("creating guest directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".guest-*")
	if err != nil {
		return "", fmt.Errorf("installing guest agent: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return "", fmt.Errorf("installing guest agent: %w", err)
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return "", fmt.Errorf("installing guest agent: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("installing guest agent: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("installing guest agent: %w", err)
	}
	return path, nil
}

// Probe returns the embedded probe program (sandbox/conformance/probe,
// static), which the blast-radius audit delivers into a tool's sandbox.
func Probe() ([]byte, error) {
	b, err := fs.ReadFile(payload, "payload/stockade-probe")
	if err != nil {
		return nil, fmt.Errorf("this stockade binary was built without the probe; build it with `make build`: %w", errdefs.ErrFailedPrecondition)
	}
	return b, nil
}

// Prune removes from dir the guests of other builds but the keep most
// recently installed, and returns what it removed. A guest in use by a
// running sandbox stays in use (the sandbox's bind mount holds the file),
// but a daemon of an older build that is still running starts its new
// sandboxes with its own guest: keep leaves room for a few such builds.
// The guest of this build (current, as Install returns it) always stays.
func Prune(dir, current string, keep int) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing guests: %w", err)
	}
	type guest struct {
		path string
		mod  time.Time
	}
	var old []guest
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !strings.HasPrefix(e.Name(), "stockade-guest-") || p == current {
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			old = append(old, guest{p, fi.ModTime()})
		}
	}
	slices.SortFunc(old, func(a, b guest) int { return b.mod.Compare(a.mod) })
	var removed []string
	for _, g := range old[min(keep, len(old)):] {
		if err := os.Remove(g.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("removing an old guest: %w", err)
		}
		removed = append(removed, g.path)
	}
	return removed, nil
}
