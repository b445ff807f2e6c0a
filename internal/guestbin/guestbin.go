// Package guestbin carries the stockade-guest binary inside the stockade
// binary, so that one file is all an operator installs. The build (make)
// compiles cmd/stockade-guest into payload/ before compiling stockade, and
// the probe of the blast-radius audit (sandbox/conformance/probe) beside it.
package guestbin

import (
	"embed"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/stockade-sh/stockade/errdefs"
)

//go:embed all:payload
var payload embed.FS

// Install writes the embedded guest into dir (once per content) and returns
// its path. The file is read-only (0555); its name carries the content hash,
// so a new build never overwrites a guest that running sandboxes use.
func Install(dir string) (string, error) {
	b, err := fs.ReadFile(payload, "payload/stockade-guest")
	if err != nil {
		return "", fmt.Errorf("this stockade binary was built without the guest agent; build it with `make build`: %w", errdefs.ErrFailedPrecondition)
	}
	// The name carries the size and a CRC-32 of the content: they only tell
	// builds apart (the directory is root's), and unlike SHA-256 they cost
	// a fraction of a millisecond (CRC-32 runs in hardware) on every start
	// of the CLI.
	path := filepath.Join(dir, fmt.Sprintf("stockade-guest-%d-%08x", len(b), crc32.ChecksumIEEE(b)))
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
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
