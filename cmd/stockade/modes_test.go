package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestPrivateLog(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, c := range []struct {
		name string
		mode fs.FileMode // of the regular file; 0: the pipe
		want fs.FileMode
	}{
		{"a log file open to others", 0o644, 0o600},
		{"a private log file", 0o600, 0o600},
		{"a pipe", 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := w
			if c.mode != 0 {
				p := filepath.Join(t.TempDir(), "stockade.log")
				if err := os.WriteFile(p, nil, c.mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(p, c.mode); err != nil {
					t.Fatal(err)
				}
				if f, err = os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0); err != nil {
					t.Fatal(err)
				}
				defer f.Close()
			}
			before, err := f.Stat()
			if err != nil {
				t.Fatal(err)
			}
			if err := privateLog(f); err != nil {
				t.Fatalf("privateLog: %v", err)
			}
			fi, err := f.Stat()
			if err != nil {
				t.Fatal(err)
			}
			want := c.want
			if c.mode == 0 {
				want = before.Mode().Perm()
			}
			if fi.Mode().Perm() != want {
				t.Errorf("got mode %#o, want %#o", fi.Mode().Perm(), want)
			}
		})
	}
}
