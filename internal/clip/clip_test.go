package clip

import (
	"strings"
	"sync"
	"testing"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{strings.Repeat("a", 20), 10, "aaaaaaaaaa... (20 bytes)"},
		// A character is never cut in two.
		{"ab€€€", 4, "ab... (11 bytes)"},
	} {
		if got := String(tc.in, tc.n); got != tc.want {
			t.Errorf("String(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestLines(t *testing.T) {
	var l Lines
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	for range 4 {
		wg.Go(func() {
			for range 75 {
				if l.Pass() {
					mu.Lock()
					passed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if passed != MaxLines || l.Suppressed() != 300-MaxLines {
		t.Errorf("got %d passed and %d suppressed of 300, want %d and %d", passed, l.Suppressed(), MaxLines, 300-MaxLines)
	}
}
