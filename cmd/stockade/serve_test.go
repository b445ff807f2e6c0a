package main

import (
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestClaimHost checks that a second daemon on the host cannot take the
// first one's state directory or, with egress, its sandbox network prefix,
// and that the error names what is shared.
func TestClaimHost(t *testing.T) {
	testenv.RequiresRoot(t) // the prefix's lock is under /run/stockade
	first := config.Default()
	first.StateDir, first.Egress, first.EgressPrefix = t.TempDir(), true, "stkcl"
	t.Cleanup(func() { os.Remove(filepath.Join(filepath.Dir(netns.UserRunDir), "egress-stkcl.lock")) })
	release, err := claimHost(first)
	if err != nil {
		t.Fatalf("first claim: %v", err)
	}
	sameState := first
	sameState.Egress = false
	samePrefix := first
	samePrefix.StateDir = t.TempDir()
	for name, c := range map[string]struct {
		cfg  config.Config
		want string
	}{
		"state directory": {sameState, "uses the state directory " + first.StateDir},
		"egress prefix":   {samePrefix, `uses the sandbox network prefix "stkcl"`},
	} {
		if r, err := claimHost(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			if r != nil {
				r()
			}
			t.Errorf("same %s: got %v, want an error containing %q", name, err, c.want)
		}
	}
	release()
	again, err := claimHost(samePrefix)
	if err != nil {
		t.Fatalf("a claim after the release: %v", err)
	}
	again()
}

// TestCheckDrivers checks the daemon's start: a default driver whose
// runtime answers its version but cannot start a sandbox keeps the daemon
// from starting; the same driver beside a working default is only
// reported, and stays unhealthy.
func TestCheckDrivers(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	guest := testenv.Guest(t)
	fake := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n[ \"$1\" = --version ] && echo 'runsc version 1.0' && exit 0\necho 'cannot run anything' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, def := range []string{"runc", "gvisor"} {
		t.Run("default "+def, func(t *testing.T) {
			rc, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: guest})
			if err != nil {
				t.Fatal(err)
			}
			gv, err := gvisor.New(gvisor.Config{Binary: fake, StateDir: t.TempDir(), GuestPath: guest})
			if err != nil {
				t.Fatal(err)
			}
			eng, err := engine.New(map[string]sandbox.Driver{"runc": rc, "gvisor": gv}, def, image.Open(t.TempDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
			if err != nil {
				t.Fatal(err)
			}
			err = checkDrivers(t.Context(), eng, slog.New(slog.DiscardHandler))
			if def == "gvisor" {
				if err == nil || !strings.Contains(err.Error(), "default driver gvisor") || !strings.Contains(err.Error(), "cannot run anything") {
					t.Fatalf("got %v, want the default driver's failure", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("got %v, want nil: only the default driver keeps the daemon from starting", err)
			}
			if err := gv.Health(t.Context()); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "self-test") {
				t.Errorf("gvisor's health after the start: got %v, want its self-test's failure", err)
			}
			if err := rc.Health(t.Context()); err != nil {
				t.Errorf("runc's health after the start: got %v, want nil", err)
			}
		})
	}
}

// TestServeFlagsMatchConfigKeys walks the daemon's flags and the keys of
// the configuration file: every flag sets the key of its name, every key
// but the structured ones has its flag, and the README's configuration
// table lists each key with its flag, so that none of the three drifts.
func TestServeFlagsMatchConfigKeys(t *testing.T) {
	fileOnly := map[string]bool{"defaults": true, "ceiling": true, "broker": true, "pools": true} // structured: no flag can hold them
	// A block of plain settings (mcp: {approval_wait, ...}) is keys of its
	// own, mcp.approval_wait, each with the flag --mcp-approval-wait.
	keys := map[string]bool{}
	for _, k := range config.FileKeys() {
		if sub := blockKeys(k); sub != nil && !fileOnly[k] {
			for _, s := range sub {
				keys[k+"."+s] = true
			}
			continue
		}
		keys[k] = true
	}
	fs, _, _ := serveFlags()
	flags := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { flags[f.Name] = true })
	for f := range flags {
		if f == "config" {
			continue // the file itself
		}
		if k := strings.ReplaceAll(f, "-", "_"); !keys[k] && !keys[blockKey(keys, f)] {
			t.Errorf("serve flag --%s has no configuration key %s", f, k)
		}
	}
	for k := range keys {
		if f := flagOf(k); !flags[f] && !fileOnly[k] {
			t.Errorf("configuration key %s has no serve flag --%s", k, f)
		}
	}

	table := readmeConfigTable(t)
	for k := range keys {
		row, ok := table[k]
		want := "--" + flagOf(k)
		if fileOnly[k] {
			want = "—"
		}
		switch {
		case !ok:
			t.Errorf("README's configuration table lacks key %s", k)
		case row != want:
			t.Errorf("README's configuration table gives key %s the flag %s, want %s", k, row, want)
		}
	}
	for k := range table {
		if !keys[k] && k != "—" {
			t.Errorf("README's configuration table lists key %s, which the configuration does not have", k)
		}
	}
	if table["—"] != "--config" {
		t.Errorf("README's configuration table lacks the row of --config")
	}
}

// flagOf is the serve flag of configuration key k: mcp.approval_wait is
// --mcp-approval-wait.
func flagOf(k string) string { return strings.NewReplacer("_", "-", ".", "-").Replace(k) }

// blockKey is the key of keys whose flag is f, or "".
func blockKey(keys map[string]bool, f string) string {
	for k := range keys {
		if flagOf(k) == f {
			return k
		}
	}
	return ""
}

// blockKeys lists the keys of the configuration's block k, dotted below
// it ("clickhouse.url"), when k holds a struct of settings, and nil when
// k is a plain setting.
func blockKeys(k string) []string {
	f, ok := yamlField(reflect.TypeFor[config.Config](), k)
	if !ok {
		return nil
	}
	return leaves(f.Type)
}

// yamlField is the field of struct t whose YAML key is k.
func yamlField(t reflect.Type, k string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if f := t.Field(i); strings.Split(f.Tag.Get("yaml"), ",")[0] == k {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// leaves lists the dotted keys of the settings below struct t, or nil when
// t is not a struct of settings.
func leaves(t reflect.Type) []string {
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Duration]() {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		if sub := leaves(f.Type); sub != nil {
			for _, s := range sub {
				out = append(out, tag+"."+s)
			}
			continue
		}
		out = append(out, tag)
	}
	return out
}

// readmeConfigTable returns the key and flag columns of the table in the
// README's "## Configuration" section, without backticks.
func readmeConfigTable(t *testing.T) map[string]string {
	t.Helper()
	_, section, ok := strings.Cut(readme(t), "\n## Configuration\n")
	if !ok {
		t.Fatal(`README.md has no "## Configuration" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "|---") {
			continue
		}
		key, fl := strings.Trim(strings.TrimSpace(cells[1]), "`"), strings.Trim(strings.TrimSpace(cells[2]), "`")
		if key == "key" {
			continue // the header
		}
		rows[key] = fl
	}
	if len(rows) == 0 {
		t.Fatal("README.md's configuration section has no table")
	}
	return rows
}

// readme returns the README, whose examples and tables tests check.
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAnalyticsSettings checks where the daemon's analytics settings come
// from: the defaults (off), then the file, then the environment's URL,
// then the flags.
func TestAnalyticsSettings(t *testing.T) {
	file := filepath.Join(t.TempDir(), "stockade.yaml")
	if err := os.WriteFile(file, []byte("analytics:\n  clickhouse: {url: 'http://file:8123', table: from_file}\n  outbox: {max_rows: 50}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  string
		args []string
		want func(a config.Analytics) string
	}{
		{"defaults", "", nil, func(a config.Analytics) string {
			if a.Enabled() || a.ClickHouse.Database != "stockade" || a.Outbox.MaxRows != 1_000_000 {
				return "want off, database stockade, max rows 1000000"
			}
			return ""
		}},
		{"file", "", []string{"--config", file}, func(a config.Analytics) string {
			if a.ClickHouse.URL != "http://file:8123" || a.ClickHouse.Table != "from_file" || a.Outbox.MaxRows != 50 {
				return "want the file's url, table and max rows"
			}
			return ""
		}},
		{"environment over the file", "http://env:8123", []string{"--config", file}, func(a config.Analytics) string {
			if a.ClickHouse.URL != "http://env:8123" || a.ClickHouse.Table != "from_file" {
				return "want the environment's url and the file's table"
			}
			return ""
		}},
		{"flags over both", "http://env:8123", []string{"--config", file, "--analytics-clickhouse-url", "http://flag:8123",
			"--analytics-outbox-max-rows", "7", "--analytics-outbox-max-age", "1h", "--analytics-interval", "250ms", "--analytics-batch-size", "9",
			"--analytics-clickhouse-database", "db", "--analytics-clickhouse-table", "t"}, func(a config.Analytics) string {
			if a.ClickHouse.URL != "http://flag:8123" || a.Outbox.MaxRows != 7 || a.Outbox.MaxAge != time.Hour || a.Interval != 250*time.Millisecond ||
				a.BatchSize != 9 || a.ClickHouse.Database != "db" || a.ClickHouse.Table != "t" {
				return "want the flags' values"
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("STOCKADE_ANALYTICS_CLICKHOUSE_URL", tc.env)
			_, cfg, load := serveFlags()
			if _, err := load(tc.args); err != nil {
				t.Fatal(err)
			}
			if msg := tc.want(cfg.Analytics); msg != "" {
				t.Errorf("got %+v; %s", cfg.Analytics, msg)
			}
		})
	}
}

// TestServeReadsDBFromEnv checks that serve takes the database from
// STOCKADE_DB over the configuration file, as the admin commands do, and
// from --db over both: a URL with a password need not be on its command
// line.
func TestServeReadsDBFromEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), "stockade.yaml")
	if err := os.WriteFile(file, []byte("db: sqlite:/from/file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, env string
		args      []string
		want      string
	}{
		{"file alone", "", []string{"--config", file}, "sqlite:/from/file"},
		{"environment over the file", "postgres://env", []string{"--config", file}, "postgres://env"},
		{"flag over both", "postgres://env", []string{"--config", file, "--db", "sqlite:/flag"}, "sqlite:/flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("STOCKADE_DB", tc.env)
			_, cfg, load := serveFlags()
			if _, err := load(tc.args); err != nil {
				t.Fatal(err)
			}
			if cfg.DB != tc.want {
				t.Errorf("db: got %q, want %q", cfg.DB, tc.want)
			}
		})
	}
}
