// Package config is Stockade's one configuration: defaults, then a file,
// then flags and environment (read by cmd/stockade only), then Validate.
// Packages below cmd/ receive typed values from here and never read the
// environment themselves.
package config

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// Drivers Stockade can be configured with.
var DriverNames = []string{"runc", "gvisor"}

// Config is the whole configuration of a Stockade process. The zero value is
// not valid; start from Default.
type Config struct {
	// DataDir holds images, the database and installed binaries.
	DataDir string `json:"data_dir"`
	// StateDir holds runtime state and bundles; it should be on a tmpfs
	// (/run) so that a reboot clears it.
	StateDir string `json:"state_dir"`
	// Driver is the default driver for invocations that do not name one.
	Driver string `json:"driver"`
	// RuncPath and RunscPath are the runtime executables (names on PATH or
	// absolute paths).
	RuncPath  string `json:"runc_path"`
	RunscPath string `json:"runsc_path"`
	// GuestPath overrides the guest agent embedded in the binary (tests).
	GuestPath string `json:"guest_path,omitempty"`
	// Defaults and Ceiling bound every invocation's limits.
	Defaults sandbox.Limits `json:"-"`
	Ceiling  sandbox.Limits `json:"-"`
}

// Default returns the embedded defaults.
func Default() Config {
	return Config{
		DataDir:   "/var/lib/stockade",
		StateDir:  "/run/stockade",
		Driver:    "gvisor",
		RuncPath:  "runc",
		RunscPath: "runsc",
		Defaults:  sandbox.DefaultLimits(),
		Ceiling:   sandbox.DefaultCeiling(),
	}
}

// ImageDir is the image store's root.
func (c Config) ImageDir() string { return c.DataDir }

// BinDir is where Stockade installs the binaries it manages (the guest).
func (c Config) BinDir() string { return filepath.Join(c.DataDir, "bin") }

// Validate checks the configuration and returns the first problem as an
// ErrInvalidArgument.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("config: %s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	switch {
	case !filepath.IsAbs(c.DataDir):
		return bad("data_dir %q must be an absolute path", c.DataDir)
	case !filepath.IsAbs(c.StateDir):
		return bad("state_dir %q must be an absolute path", c.StateDir)
	case !slices.Contains(DriverNames, c.Driver):
		return bad("unknown driver %q (known: %v)", c.Driver, DriverNames)
	case c.Defaults.Timeout <= 0 || c.Defaults.Timeout > time.Hour:
		return bad("default timeout %s out of range", c.Defaults.Timeout)
	}
	if err := c.Defaults.Check(c.Ceiling); err != nil {
		return bad("defaults above the ceiling: %v", err)
	}
	return nil
}
