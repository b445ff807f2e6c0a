package dataroot

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

// tree builds a data root, data, in a temporary directory: the file m.json,
// the directory models (a.bin, sub/b.bin), via (a link to models),
// link-in (a link to m.json), linked (holding a link to m.json), fifo
// (holding the named pipe p); beside it outside.json and root-link, the
// data root named through a symlink.
func tree(t *testing.T) (base, root string) {
	t.Helper()
	base = t.TempDir()
	root = filepath.Join(base, "data")
	// Each entry: a path below base and what it is ("/" a directory,
	// "|" a named pipe, "-" a file, else a symlink to that).
	entries := [][2]string{
		{"data/models/sub", "/"}, {"data/linked", "/"}, {"data/fifo", "/"}, {"data/fifo/p", "|"},
		{"data/m.json", "-"}, {"data/models/a.bin", "-"}, {"data/models/sub/b.bin", "-"}, {"outside.json", "-"},
		{"data/via", root + "/models"}, {"data/link-in", "m.json"}, {"data/linked/in", "../m.json"}, {"root-link", root},
	}
	for _, e := range entries {
		p := filepath.Join(base, e[0])
		var err error
		switch e[1] {
		case "/":
			err = os.MkdirAll(p, 0o700)
		case "|":
			err = syscall.Mkfifo(p, 0o600)
		case "-":
			err = os.WriteFile(p, []byte("x"), 0o600)
		default:
			err = os.Symlink(e[1], p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return base, root
}

func TestResolve(t *testing.T) {
	base, root := tree(t)
	runLink := filepath.Join(base, "run-link")
	if err := os.Symlink("/run", runLink); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		dir, resolved, want string // want: a fragment of Err; "" when usable
	}{
		{dir: root, resolved: root},
		{dir: base + "/root-link", resolved: root},
		{dir: root + "/", resolved: root},
		{dir: "", want: "no data root is configured"},
		{dir: "data", want: "data root data must be an absolute path"},
		{dir: base + "/nope", want: "no such file or directory"},
		{dir: "/", want: "it is the host's root filesystem"},
		{dir: "/root", want: "it is a home directory or inside one"},
		{dir: "/home", want: "it is a home directory or inside one"},
		{dir: "/run", want: "it is inside /run, which is never shared"},
		{dir: "/proc/self", want: "it is inside /proc"},
		{dir: runLink, want: "it is inside /run"},
	} {
		t.Run(tt.dir, func(t *testing.T) {
			if tt.want != "" && strings.HasPrefix(tt.dir, "/") && !strings.HasPrefix(tt.dir, base) {
				if _, err := os.Stat(tt.dir); err != nil {
					t.Skipf("%s: %v", tt.dir, err)
				}
			}
			r := Resolve(tt.dir)
			err := r.Err()
			if tt.want == "" {
				if err != nil || r.Resolved() != tt.resolved {
					t.Errorf("got %q, %v; want %s usable", r.Resolved(), err, tt.resolved)
				}
				return
			}
			var p *Problem
			if !errors.As(err, &p) || p.Kind != KindNoRoot || !strings.Contains(p.Message, tt.want) {
				t.Errorf("got %v, want a %s problem with %q", err, KindNoRoot, tt.want)
			}
			if _, p := r.File(root + "/m.json"); p == nil || p.Kind != KindNoRoot {
				t.Errorf("File under an unusable root: got %v, want %s", p, KindNoRoot)
			}
		})
	}
	if err := (Root{}).Err(); err == nil {
		t.Error("the zero Root: got no error, want one")
	}
}

func TestFile(t *testing.T) {
	base, root := tree(t)
	r := Resolve(root)
	for _, tt := range []struct {
		name, src string
		want      Source // when kind is ""
		kind      Kind
		fragment  string
	}{
		{name: "file", src: root + "/m.json", want: Source{Root: root, Path: root + "/m.json", Rel: "m.json"}},
		{name: "directory", src: root + "/models", want: Source{Root: root, Path: root + "/models", Rel: "models", Dir: true}},
		{name: "the root, which holds a pipe", src: root, kind: KindSource, fragment: "holds " + root + "/fifo/p"},
		{name: "through a linked directory", src: root + "/via/sub/b.bin", want: Source{Root: root, Path: root + "/models/sub/b.bin", Rel: "models/sub/b.bin"}},
		{name: "a symlink", src: root + "/link-in", kind: KindSymlink, fragment: "link-in is a symlink to " + root + "/m.json; a copy never follows links"},
		{name: "a linked directory", src: root + "/via", kind: KindSymlink, fragment: "is a symlink to " + root + "/models"},
		{name: "a tree with a symlink", src: root + "/linked", kind: KindSymlink, fragment: "holds the symlink " + root + "/linked/in to " + root + "/m.json"},
		{name: "a pipe", src: root + "/fifo/p", kind: KindSource, fragment: "neither a regular file nor a directory"},
		{name: "a tree with a pipe", src: root + "/fifo", kind: KindSource, fragment: "holds " + root + "/fifo/p, which is neither"},
		{name: "unclean", src: root + "/models/../m.json", kind: KindSource, fragment: "must be a clean path (write " + root + "/m.json)"},
		{name: "relative", src: "m.json", kind: KindSource, fragment: "must be an absolute path under the data root " + root},
		{name: "empty", src: "", kind: KindSource, fragment: "the source is required"},
		{name: "outside", src: base + "/outside.json", kind: KindOutside, fragment: "is outside the data root"},
		{name: "home", src: "/root/m.json", kind: KindHome, fragment: "home directories hold credentials and are never copied"},
		{name: "run", src: "/run/secrets", kind: KindSystem, fragment: "inside /run, which is never copied"},
		{name: "credentials", src: root + "/x/.aws/config", kind: KindCredentials, fragment: "inside a .aws directory"},
		{name: "missing", src: root + "/nope", kind: KindMissing, fragment: "does not exist"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, p := r.File(tt.src)
			if tt.kind == "" {
				if p != nil || got != tt.want {
					t.Errorf("got %+v, %v; want %+v", got, p, tt.want)
				}
				return
			}
			if p == nil || p.Kind != tt.kind || !strings.Contains(p.Message, tt.fragment) {
				t.Errorf("got %+v, %v; want a %s problem with %q", got, p, tt.kind, tt.fragment)
			}
		})
	}
}

// The data root itself may be a source, copied whole, once it holds
// nothing TestFile's refuses.
func TestFileRoot(t *testing.T) {
	_, root := tree(t)
	for _, l := range []string{"via", "link-in", "linked", "fifo"} {
		if err := os.RemoveAll(filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	want := Source{Root: root, Path: root, Rel: ".", Dir: true}
	if got, p := Resolve(root).File(root); p != nil || got != want {
		t.Errorf("got %+v, %v; want %+v", got, p, want)
	}
}

func TestFileTooLarge(t *testing.T) {
	_, root := tree(t)
	saved := maxTreeEntries
	defer func() { maxTreeEntries = saved }()
	maxTreeEntries = 3 // models, a.bin, sub: b.bin is one too many
	if _, p := Resolve(root).File(root + "/models"); p == nil || p.Kind != KindTooLarge {
		t.Errorf("got %v, want %s", p, KindTooLarge)
	}
	maxTreeEntries = 4
	if _, p := Resolve(root).File(root + "/models"); p != nil {
		t.Errorf("got %v, want none", p)
	}
}

// CheckFile sees a symlink swapped in after a declaration was validated,
// as the image builder calls it before reading.
func TestCheckFileRechecks(t *testing.T) {
	base, root := tree(t)
	s, err := CheckFile(root, root+"/models")
	if err != nil || s.Rel != "models" || s.Root != root {
		t.Fatalf("got %+v, %v", s, err)
	}
	if err := os.RemoveAll(root + "/models"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(base, root+"/models"); err != nil {
		t.Fatal(err)
	}
	_, err = CheckFile(root, root+"/models")
	var p *Problem
	if !errors.As(err, &p) || p.Kind != KindSymlinkEscape || !errdefs.IsFailedPrecondition(err) {
		t.Errorf("got %v, want a %s problem of class failed precondition", err, KindSymlinkEscape)
	}
	if _, err := CheckFile("/root", "/root/m.json"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "home directory") {
		t.Errorf("data root /root: got %v, want it refused", err)
	}
}

func TestMount(t *testing.T) {
	base, root := tree(t)
	r := Resolve(base + "/root-link")
	for _, tt := range []struct {
		src, resolved string
		kind          Kind
	}{
		{src: root + "/link-in", resolved: root + "/m.json"},
		{src: base + "/root-link/via/", resolved: root + "/models"},
		{src: root + "/models/../m.json", resolved: root + "/m.json"},
		{src: "", kind: KindSource},
		{src: "/var/run/docker.sock", kind: KindSocket},
		{src: root + "/fifo/p", kind: KindSource},
	} {
		got, p := r.Mount(tt.src)
		switch {
		case tt.kind == "" && (p != nil || got != tt.resolved):
			t.Errorf("Mount(%q): got %q, %v; want %s", tt.src, got, p, tt.resolved)
		case tt.kind != "" && (p == nil || p.Kind != tt.kind || !strings.HasPrefix(p.Message, "mount source ")):
			t.Errorf("Mount(%q): got %v, want a %s problem naming the mount source", tt.src, p, tt.kind)
		}
	}
}

func TestIsCredentialDir(t *testing.T) {
	for p, want := range map[string]bool{".ssh": true, "a/.ssh": true, "/x/.config/gcloud": true, "gcloud": false, "a/.sshx": false, "x.ssh": false} {
		if got := IsCredentialDir(p); got != want {
			t.Errorf("IsCredentialDir(%q) = %t, want %t", p, got, want)
		}
	}
}
