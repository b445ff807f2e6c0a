package image

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// statusOf is a dpkg status database listing pkg as installed.
func statusOf(pkg string) string {
	return "Package: " + pkg + "\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.0\n\n"
}

// TestTreePackagesRefusesPlanted reads the package database of trees a
// build sandbox could have left: a status file that is a link to a host
// file or to /dev/zero, a FIFO, a file larger than the bound. Each is
// refused, and none blocks.
func TestTreePackagesRefusesPlanted(t *testing.T) {
	host := filepath.Join(t.TempDir(), "host-status")
	if err := os.WriteFile(host, []byte(statusOf("host-only")), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		plant func(status string) error
		want  string // in the error; "" for success
	}{
		{"regular", func(p string) error { return os.WriteFile(p, []byte(statusOf("tree-pkg")), 0o644) }, ""},
		{"link to a host file", func(p string) error { return os.Symlink(host, p) }, "not a regular file"},
		{"link to /dev/zero", func(p string) error { return os.Symlink("/dev/zero", p) }, "not a regular file"},
		{"relative link out", func(p string) error { return os.Symlink("../../../../../../../.."+host, p) }, "not a regular file"},
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o644) }, "not a regular file"},
		{"too large", func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			defer f.Close()
			return f.Truncate(maxStatusBytes + 1)
		}, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rootfs := t.TempDir()
			dir := filepath.Join(rootfs, "var/lib/dpkg")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := tt.plant(filepath.Join(dir, "status")); err != nil {
				t.Fatal(err)
			}
			type result struct {
				pkgs map[string]string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				pkgs, err := treePackages(rootfs)
				done <- result{pkgs, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("treePackages blocked")
			}
			if tt.want == "" {
				if r.err != nil || r.pkgs["tree-pkg"] != "1.0" {
					t.Fatalf("treePackages = %v, %v; want tree-pkg 1.0", r.pkgs, r.err)
				}
				return
			}
			if r.err == nil || !strings.Contains(r.err.Error(), tt.want) {
				t.Errorf("treePackages = %v, %v; want an error saying %q", r.pkgs, r.err, tt.want)
			}
			if _, ok := r.pkgs["host-only"]; ok {
				t.Errorf("treePackages read the host's file: %v", r.pkgs)
			}
		})
	}
}

// TestPackageScriptsRefusesPlanted reads a package.json an earlier
// install script replaced with a FIFO or a link to a host file.
func TestPackageScriptsRefusesPlanted(t *testing.T) {
	host := filepath.Join(t.TempDir(), "package.json")
	if err := os.WriteFile(host, []byte(`{"scripts": {"install": "host"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		plant func(p string) error
		ok    bool
	}{
		{"regular", func(p string) error { return os.WriteFile(p, []byte(`{"scripts": {"install": "make"}}`), 0o644) }, true},
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o644) }, false},
		{"link to a host file", func(p string) error { return os.Symlink(host, p) }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rootfs := t.TempDir()
			dir := filepath.Join(rootfs, "node_modules/x")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := tt.plant(filepath.Join(dir, "package.json")); err != nil {
				t.Fatal(err)
			}
			root, err := os.OpenRoot(rootfs)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			done := make(chan error, 1)
			var scripts map[string]string
			go func() {
				var err error
				scripts, err = packageScripts(root, "node_modules/x")
				done <- err
			}()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("packageScripts blocked")
			}
			if tt.ok != (err == nil) {
				t.Fatalf("packageScripts = %v, %v; want ok %t", scripts, err, tt.ok)
			}
			if tt.ok && scripts["install"] != "make" {
				t.Errorf("scripts = %v, want install: make", scripts)
			}
		})
	}
}

// TestApparentSizeStaysInTree measures a tree holding a link to a host
// directory: the files there are not counted.
func TestApparentSizeStaysInTree(t *testing.T) {
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "big"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "small"), make([]byte, 100), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(tree, "out")); err != nil {
		t.Fatal(err)
	}
	if got := apparentSize(tree); got != 100 {
		t.Errorf("apparentSize = %d, want 100 (the tree's own file)", got)
	}
	if got := apparentSize(host); got != 1<<20 {
		t.Errorf("apparentSize(host) = %d, want %d", got, 1<<20)
	}
}
