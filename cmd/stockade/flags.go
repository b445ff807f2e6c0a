package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/stockade-sh/stockade/config"
)

// configFlags registers the flags every subcommand that touches sandboxes
// shares, on top of config.Default(). The environment is read here and
// nowhere else: STOCKADE_DATA_DIR, STOCKADE_STATE_DIR, STOCKADE_DRIVER.
func configFlags(fs *flag.FlagSet) *config.Config {
	cfg := config.Default()
	if v := os.Getenv("STOCKADE_DATA_DIR"); v != "" {
		cfg.DataDir = v
	}
	if v := os.Getenv("STOCKADE_STATE_DIR"); v != "" {
		cfg.StateDir = v
	}
	if v := os.Getenv("STOCKADE_DRIVER"); v != "" {
		cfg.Driver = v
	}
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for images, database and binaries")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory for runtime state (a tmpfs such as /run)")
	fs.StringVar(&cfg.RuncPath, "runc", cfg.RuncPath, "runc executable")
	fs.StringVar(&cfg.RunscPath, "runsc", cfg.RunscPath, "runsc executable")
	fs.StringVar(&cfg.GuestPath, "guest", cfg.GuestPath, "guest agent binary (default: the one embedded in stockade)")
	return &cfg
}

// parseSize parses a byte size such as 512MiB, 1GiB, 64M or 1048576.
func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1},
	}
	mult := int64(1)
	num := strings.TrimSpace(s)
	for _, u := range units {
		if v, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = v, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid size %q (use e.g. 512MiB)", s)
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n * mult, nil
}
