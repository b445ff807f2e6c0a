package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSessionsConfig reads the sessions: block from a file (durations and
// sizes in their usual forms) and refuses bounds that contradict each
// other.
func TestSessionsConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stockade.yaml")
	if err := os.WriteFile(path, []byte("sessions:\n  idle_timeout: 5m\n  ttl: 2h\n  workspace_size: 64MiB\n  max_file_size: 1m\n  on_shutdown: end\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := Default()
	if err := c.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if s := c.Sessions; s.IdleTimeout != 5*time.Minute || s.TTL != 2*time.Hour || s.WorkspaceSize != 64<<20 || s.MaxFileSize != 1<<20 || s.MaxPerWorkspace != 4 ||
		s.OnShutdown != OnShutdownEnd {
		t.Fatalf("got %+v, want the file's values over the defaults", s)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Sessions)
		want string
	}{
		{"idle above its ceiling", func(s *Sessions) { s.IdleTimeout = 2 * time.Hour }, "sessions.idle_timeout"},
		{"ttl above its ceiling", func(s *Sessions) { s.TTL = 48 * time.Hour }, "sessions.ttl"},
		{"no sessions", func(s *Sessions) { s.MaxPerWorkspace = 0 }, "sessions.max_per_workspace"},
		{"workspace above its ceiling", func(s *Sessions) { s.WorkspaceSize = 2 << 30 }, "sessions.workspace_size"},
		{"no file", func(s *Sessions) { s.MaxFileSize = 0 }, "sessions.max_file_size"},
		{"hourly credits", func(s *Sessions) { s.CreditsPerSessionHour = 1 }, "sessions.credits_per_session_hour"},
		{"no ttl", func(s *Sessions) { s.TTL = 0 }, "sessions.ttl"},
		{"unknown shutdown", func(s *Sessions) { s.OnShutdown = "drop" }, "sessions.on_shutdown"},
		{"no shutdown", func(s *Sessions) { s.OnShutdown = "" }, "sessions.on_shutdown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.edit(&c.Sessions)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %s", err, tc.want)
			}
		})
	}
}
