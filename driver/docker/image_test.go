package docker

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

func TestWriteTree(t *testing.T) {
	root := t.TempDir()
	mk := func(name, data string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("bin/tool", "#!/bin/sh\n", 0o755)
	mk("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644)
	mk(".stockade/guest", "", 0o644) // the image's empty mount point
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/bin/tool", filepath.Join(root, "bin/alias")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "bin/tool"), filepath.Join(root, "bin/tool2")); err != nil {
		t.Fatal(err)
	}
	guest := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(guest, []byte("GUEST-BINARY"), 0o500); err != nil {
		t.Fatal(err)
	}

	var buf bytes.Buffer
	if err := writeTree(&buf, root, guest); err != nil {
		t.Fatalf("writeTree: %v", err)
	}
	got := map[string]*tar.Header{}
	data := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name], data[h.Name] = h, string(b)
	}

	for _, c := range []struct {
		name     string
		typ      byte
		mode     int64
		linkname string
		data     string
	}{
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/tool", typ: tar.TypeReg, mode: 0o755, data: "#!/bin/sh\n"},
		{name: "bin/tool2", typ: tar.TypeLink, mode: 0o755, linkname: "bin/tool"},
		{name: "bin/alias", typ: tar.TypeSymlink, mode: 0o777, linkname: "/bin/tool"},
		{name: "etc/passwd", typ: tar.TypeReg, mode: 0o644, data: "root:x:0:0::/root:/bin/sh\n"},
		{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		{name: ".stockade/guest", typ: tar.TypeReg, mode: 0o555, data: "GUEST-BINARY"},
	} {
		t.Run(strings.ReplaceAll(c.name, "/", "_"), func(t *testing.T) {
			h, ok := got[c.name]
			if !ok {
				t.Fatalf("no entry %s in the archive", c.name)
			}
			if h.Typeflag != c.typ {
				t.Errorf("type: got %q, want %q", h.Typeflag, c.typ)
			}
			if h.Mode&0o7777 != c.mode {
				t.Errorf("mode: got %o, want %o", h.Mode&0o7777, c.mode)
			}
			if h.Linkname != c.linkname {
				t.Errorf("link: got %q, want %q", h.Linkname, c.linkname)
			}
			if data[c.name] != c.data {
				t.Errorf("content: got %q, want %q", data[c.name], c.data)
			}
			if h.Uid != os.Getuid() || h.Uname != "" {
				t.Errorf("owner: got %d (%q), want %d and no name", h.Uid, h.Uname, os.Getuid())
			}
		})
	}
	if h := got[".stockade/guest"]; h != nil && (h.Uid != 0 || h.Gid != 0) {
		t.Errorf("guest owner: got %d:%d, want 0:0", h.Uid, h.Gid)
	}
}

func TestImageTag(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	guest := strings.Repeat("cd", 32)
	for _, c := range []struct {
		img     sandbox.Image
		want    string
		wantErr bool
	}{
		{img: sandbox.Image{Name: "python", Digest: "sha256:" + hex}, want: "stockade/python:abababababab-cdcdcdcdcdcd-" + treeFormat},
		{img: sandbox.Image{Name: "Not A Name", Digest: "sha256:" + hex}, want: "stockade/image:abababababab-cdcdcdcdcdcd-" + treeFormat},
		{img: sandbox.Image{Name: "python", Digest: "md5:abc"}, wantErr: true},
	} {
		got, err := ImageTag(c.img, guest)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("ImageTag(%+v): got %q, %v; want %q (error %t)", c.img, got, err, c.want, c.wantErr)
		}
	}
}

func TestContainerConfig(t *testing.T) {
	d, err := New(Config{GuestPath: "/nonexistent/guest"})
	if err != nil {
		t.Fatal(err)
	}
	l := d.cfg.Defaults
	cc, hc, err := d.containerConfig("sbx-1", sandbox.Spec{Labels: map[string]string{"tool": "x"}}, l, "stockade/shell:t")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		ok   bool
	}{
		{"read-only rootfs", hc.ReadonlyRootfs},
		{"network none", hc.NetworkMode == "none"},
		{"all capabilities dropped", len(hc.CapDrop) == 1 && hc.CapDrop[0] == "ALL" && len(hc.CapAdd) == 0},
		{"no-new-privileges", strings.Contains(strings.Join(hc.SecurityOpt, " "), "no-new-privileges:true")},
		{"seccomp profile passed", len(hc.SecurityOpt) == 2 && strings.HasPrefix(hc.SecurityOpt[1], `seccomp={"defaultAction":`)},
		{"seccomp denies clone3 with ENOSYS", strings.Contains(hc.SecurityOpt[1], `"clone3"`)},
		{"not privileged", !hc.Privileged},
		{"memory 512 MiB", hc.Memory == 512<<20},
		{"no swap", hc.MemorySwap == hc.Memory},
		{"half a CPU", hc.NanoCPUs == 500000000},
		{"pids 128", hc.PidsLimit != nil && *hc.PidsLimit == 128},
		{"tmpfs /tmp capped, nosuid, nodev", hc.Tmpfs["/tmp"] == "rw,exec,nosuid,nodev,mode=1777,size=67108864"},
		{"no bind mounts", len(hc.Binds) == 0 && len(hc.Mounts) == 0},
		{"no init", hc.Init != nil && !*hc.Init},
		{"not auto-removed", !hc.AutoRemove},
		{"private cgroup namespace", hc.CgroupnsMode == "private"},
		{"private IPC", hc.IpcMode == "private"},
		{"no logs", hc.LogConfig.Type == "none"},
		{"user nobody", cc.User == "65534:65534"},
		{"empty environment", cc.Env != nil && len(cc.Env) == 0},
		{"guest is the entrypoint", len(cc.Entrypoint) == 1 && cc.Entrypoint[0] == "/.stockade/guest"},
		{"stdin open once, no tty", cc.OpenStdin && cc.StdinOnce && !cc.Tty},
		{"labelled", cc.Labels[LabelSandbox] == "sbx-1" && cc.Labels[LabelPrefix+"tool"] == "x"},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: not so in %+v %+v", c.name, cc, hc)
		}
	}
	if _, _, err := d.containerConfig("sbx-1", sandbox.Spec{Network: sandbox.NetworkEgress}, l, "t"); err == nil {
		t.Errorf("network egress: got no error, want one (not supported)")
	}
}
