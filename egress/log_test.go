package egress

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/stockade-sh/stockade/internal/clip"
)

// logBuffer collects a logger's lines at Debug.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// check fails t unless the log holds want lines of msg, each shorter than
// 2 KiB, and a line saying count were not logged one by one.
func (l *logBuffer) check(t *testing.T, msg string, want int, count int) {
	t.Helper()
	l.mu.Lock()
	log := l.b.String()
	l.mu.Unlock()
	n := strings.Count(log, `msg="`+msg+`"`)
	longest := 0
	for _, line := range strings.Split(log, "\n") {
		longest = max(longest, len(line))
	}
	counted := regexp.MustCompile(`not logged one by one" .*count=` + fmt.Sprint(count) + `\n`).MatchString(log)
	if n != want || longest > 2048 || !counted {
		t.Errorf("got %d %q lines, the longest %d bytes, count line %v; want %d, at most 2 KiB each, and one counting %d",
			n, msg, longest, counted, want, count)
	}
}

// TestRefusalLinesBounded floods a gate and a DNS responder with refusals
// naming long hosts: each logs the first clip.MaxLines, cut short, and
// counts the rest when it closes.
func TestRefusalLinesBounded(t *testing.T) {
	const flood = clip.MaxLines + 50
	long := strings.Repeat("a", 30000) + ".test"
	t.Run("proxy", func(t *testing.T) {
		var logs logBuffer
		e := newEnv(t, func(_ *Policy, c *Config) { c.Logger = logs.logger() })
		for range flood {
			c, err := net.Dial("tcp", e.httpAddr)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", long)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.ReadAll(c)
			c.Close()
		}
		// Each refusal is reported before its answer is written.
		if e.rec.mu.Lock(); len(e.rec.ds) != flood {
			t.Errorf("got %d decisions, want %d", len(e.rec.ds), flood)
		}
		e.rec.mu.Unlock()
		e.gate.Close()
		logs.check(t, "egress refused", clip.MaxLines, flood-clip.MaxLines)
	})
	t.Run("dns", func(t *testing.T) {
		var logs logBuffer
		udp, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		d, err := ServeDNS(context.Background(), DNSConfig{Sandbox: "sbx-dns", Answer: loopback, Logger: logs.logger()}, udp, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		// Names of 250 bytes, the most a question carries.
		name := strings.Repeat(strings.Repeat("b", 60)+".", 4) + "test."
		for range flood {
			if rc, _ := query(t, "udp", udp.LocalAddr().String(), name, dnsmessage.TypeA); rc != dnsmessage.RCodeNameError {
				t.Fatalf("got %v, want NXDOMAIN", rc)
			}
		}
		d.Close()
		logs.check(t, "egress DNS refused", clip.MaxLines, flood-clip.MaxLines)
	})
}
