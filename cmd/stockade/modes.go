package main

import (
	"fmt"
	"os"
	"syscall"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/internal/fsmode"
)

// layout is what of cfg's directories fsmode rules, with the witness
// directory wit (where it is configured outside the data directory).
func layout(cfg config.Config, wit string) fsmode.Layout {
	return fsmode.Layout{DataDir: cfg.DataDir, StateDir: cfg.StateDir, DataRoot: cfg.MountRoot(),
		Private: []string{cfg.CheckpointDir(), wit}}
}

// fixModes gives what the daemon keeps on the host the modes fsmode says,
// for an install made before the rule, and makes its log private.
func fixModes(cfg config.Config, wit string) error {
	if err := fsmode.Fix(layout(cfg, wit)); err != nil {
		return fmt.Errorf("making the daemon's files private to their owner: %w", err)
	}
	return privateLog(os.Stderr)
}

// fixDataDir makes what an older install left open in the data directory
// dataDir, and in the directories private, private, for a command that
// opens it without the daemon's whole configuration (the admin and image
// commands). A failure only warns: what the command creates is private
// anyway, and the database is made private as it opens.
func fixDataDir(dataDir string, private ...string) {
	if err := fsmode.Fix(fsmode.Layout{DataDir: dataDir, Private: private}); err != nil {
		fmt.Fprintf(os.Stderr, "stockade: warning: making the data directory private: %v\n", err)
	}
}

// privateLog makes f, where the daemon logs, readable by its owner only
// when it is a regular file of this process's user (scripts/up.sh appends
// to /var/log/stockade.log): the log names workspaces, executions and the
// causes of their failures. A terminal, a pipe or journald is left alone.
func privateLog(f *os.File) error {
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() == fsmode.File {
		return nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return nil
	}
	if err := f.Chmod(fsmode.File); err != nil {
		return fmt.Errorf("making the log file %s mode %#o: %w", f.Name(), fsmode.File, err)
	}
	return nil
}
