package sandboxkit

import (
	"errors"
	"strings"
	"testing"
)

func TestOneLine(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"one line", " failed \n", "failed"},
		{"last line wins", "warning: x\n\nerror: y\n", "error: y"},
		{"long", strings.Repeat("x", 600), strings.Repeat("x", 512)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := OneLine(tt.in); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestBoundedBuffer(t *testing.T) {
	b := &BoundedBuffer{Max: 5}
	for _, s := range []string{" abc", "defgh", "ij"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q): got %d, %v, want %d, nil", s, n, err, len(s))
		}
	}
	if got := b.String(); got != "abcd" {
		t.Errorf("got %q, want %q", got, "abcd")
	}
}

func TestZeroCgroup(t *testing.T) {
	var c Cgroup
	c.ResetPeak()
	if c.MemoryDir() != "" || c.OOMKills() != 0 || c.Peak() != 0 || c.Dirs() != nil {
		t.Errorf("zero Cgroup: got dir %q, %d OOM kills, peak %d, dirs %v; want nothing", c.MemoryDir(), c.OOMKills(), c.Peak(), c.Dirs())
	}
}

func TestUntilDone(t *testing.T) {
	var u UntilDone
	calls := 0
	fail := errors.New("busy")
	f := func() error {
		calls++
		if calls < 2 {
			return fail
		}
		return nil
	}
	if err := u.Do(f); err != fail {
		t.Fatalf("first call: got %v, want %v", err, fail)
	}
	if err := u.Do(f); err != nil {
		t.Fatalf("second call: got %v, want nil", err)
	}
	if err := u.Do(f); err != nil || calls != 2 {
		t.Errorf("after success: got %v after %d calls, want nil after 2", err, calls)
	}
}
