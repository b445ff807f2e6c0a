package sandboxkit

import (
	"bytes"
	"strings"
	"sync"
)

// BoundedBuffer keeps the first Max bytes written to it and drops the rest,
// while reporting every write as complete. A sandbox's stderr (the
// runtime's, or the guest's) goes to one: it explains failed starts without
// letting a chatty sandbox use unbounded memory. It is safe for concurrent
// use; the zero BoundedBuffer keeps nothing.
type BoundedBuffer struct {
	Max int

	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *BoundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.Max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// String is what was kept, without leading and trailing white space.
func (b *BoundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.buf.String())
}

// OneLine folds a message (a runtime's or the guest's) for a one-line
// error: its last non-empty line, where runtimes put the decisive message,
// cut to 512 bytes.
func OneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = strings.TrimSpace(s[i+1:])
	}
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}
