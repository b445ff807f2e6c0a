package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/stockade-sh/stockade/config"
)

// configFlags registers the flags shared by the subcommands that touch
// sandboxes, bound to a Config that starts from config.Default(). Call
// load with the arguments instead of fs.Parse: it returns the positional
// arguments and applies, in order of precedence from low to high,
// the defaults, the --config file (if the subcommand has one), the STOCKADE_*
// environment (STOCKADE_DATA_DIR, STOCKADE_STATE_DIR, STOCKADE_DRIVER,
// SANDBOX_DRIVER as an alias of STOCKADE_DRIVER, DOCKER_HOST) and the flags
// given.
// The environment is read here and nowhere else.
func configFlags(fs *flag.FlagSet) (*config.Config, func(args []string) ([]string, error)) {
	cfg := config.Default()
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for images, database and binaries (env STOCKADE_DATA_DIR)")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory for runtime state, a tmpfs such as /run (env STOCKADE_STATE_DIR)")
	fs.StringVar(&cfg.RuncPath, "runc", cfg.RuncPath, "runc executable")
	fs.StringVar(&cfg.RunscPath, "runsc", cfg.RunscPath, "runsc executable")
	fs.StringVar(&cfg.GuestPath, "guest", cfg.GuestPath, "guest agent binary (default: the one embedded in stockade)")
	fs.StringVar(&cfg.DockerHost, "docker-host", cfg.DockerHost, "Docker Engine for the docker driver (env DOCKER_HOST; default the Docker client's)")
	configFile := ""
	if fs.Name() == "serve" {
		fs.StringVar(&configFile, "config", "", "YAML configuration file")
	}
	load := func(args []string) ([]string, error) {
		if _, err := parseArgs(fs, args); err != nil {
			return nil, usageError{err}
		}
		if configFile != "" {
			if err := cfg.LoadFile(configFile); err != nil {
				return nil, usageError{err}
			}
		}
		for _, e := range []struct {
			name string
			dst  *string
		}{
			{"STOCKADE_DATA_DIR", &cfg.DataDir}, {"STOCKADE_STATE_DIR", &cfg.StateDir},
			{"SANDBOX_DRIVER", &cfg.Driver}, {"STOCKADE_DRIVER", &cfg.Driver},
			{"DOCKER_HOST", &cfg.DockerHost},
		} {
			if v := os.Getenv(e.name); v != "" {
				*e.dst = v
			}
		}
		// Parsing again re-applies the flags given over the file and the
		// environment; flags not given keep what those set.
		pos, err := parseArgs(fs, args)
		if err != nil {
			return nil, usageError{err}
		}
		return pos, nil
	}
	return &cfg, load
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

// parseArgs parses args with fs, allowing flags after positional arguments
// (`stockade credits grant demo 10 --db URL`), and returns the positional
// arguments. "--" ends flag parsing.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
