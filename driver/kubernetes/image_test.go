package kubernetes

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestArchiveTerminationLogDir holds what keeps the kubelet's termination
// message file out of the sandbox's reach: the image has its mount point
// in a directory of root's, mode 0700.
func TestArchiveTerminationLogDir(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	guest := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(guest, []byte("guest"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeTree(&buf, root, guest); err != nil {
		t.Fatal(err)
	}
	got := map[string]*tar.Header{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	if got["etc/passwd"] == nil {
		t.Fatalf("the archive has no etc/passwd, so the check cannot see the image's entries: %v", got)
	}
	dir, file := got[strings.TrimPrefix(TerminationLogDir, "/")+"/"], got[strings.TrimPrefix(TerminationLogPath, "/")]
	if dir == nil || dir.Typeflag != tar.TypeDir || dir.Mode&0o777 != 0o700 || dir.Uid != 0 {
		t.Errorf("%s: got %+v, want root's directory, mode 0700", TerminationLogDir, dir)
	}
	if file == nil || file.Typeflag != tar.TypeReg || file.Uid != 0 {
		t.Errorf("%s: got %+v, want root's file (the mount point)", TerminationLogPath, file)
	}
}
