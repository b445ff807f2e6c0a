package sandbox

import (
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

func TestCheckCommand(t *testing.T) {
	ok := ExecRequest{Argv: []string{"/usr/bin/python3", "main.py"}, Env: []string{"A=1"}, File: File{Name: "main.py", Data: []byte("print(1)")}}
	if err := CheckCommand("remote", ok); err != nil {
		t.Fatalf("a plain request: %v", err)
	}
	for _, tt := range []struct {
		name string
		edit func(*ExecRequest)
		want string
	}{
		{"streamed stdin", func(r *ExecRequest) { r.StdinStream = true }, "streamed stdin"},
		{"relative argv[0]", func(r *ExecRequest) { r.Argv = []string{"python3"} }, "absolute path"},
		{"no argv", func(r *ExecRequest) { r.Argv = nil }, "absolute path"},
		{"big code", func(r *ExecRequest) { r.File.Data = make([]byte, MaxCodeSize+1) }, "larger than"},
		{"file in a directory", func(r *ExecRequest) { r.File.Name = "a/main.py" }, "plain file name"},
		{"bad env", func(r *ExecRequest) { r.Env = []string{"=x"} }, "KEY=value"},
		{"NUL in an argument", func(r *ExecRequest) { r.Argv = []string{"/bin/sh", "a\x00"} }, "NUL"},
	} {
		r := ok
		r.Argv, r.Env = append([]string(nil), ok.Argv...), append([]string(nil), ok.Env...)
		tt.edit(&r)
		err := CheckCommand("remote", r)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "remote: ") {
			t.Errorf("%s: got %v, want ErrInvalidArgument naming the driver and %q", tt.name, err, tt.want)
		}
	}
}
