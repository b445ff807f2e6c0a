package console

import (
	"fmt"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
)

func TestSessions(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newSessions(time.Hour, func() time.Time { return now })
	p := capability.Principal{KeyID: "key_a", WorkspaceID: "ws", Role: "approver"}

	t.Run("lookup and expiry", func(t *testing.T) {
		token, sess := s.create(p)
		if got := s.get(token); got != sess {
			t.Fatalf("get: got %v, want the session", got)
		}
		if s.get("not-a-token") != nil || s.get("") != nil {
			t.Error("get of an unknown token: got a session")
		}
		if sess.csrf == "" || sess.csrf == token {
			t.Errorf("csrf token: got %q, want one of its own", sess.csrf)
		}
		now = now.Add(time.Hour)
		if s.get(token) != nil || s.live(sess) {
			t.Error("after its hour: the session is still live")
		}
	})
	t.Run("a key's sessions are bounded", func(t *testing.T) {
		first, _ := s.create(p)
		for range maxSessionsPerKey {
			now = now.Add(time.Second)
			s.create(p)
		}
		if s.get(first) != nil {
			t.Error("the key's oldest session outlived its cap")
		}
	})
	t.Run("the table is bounded", func(t *testing.T) {
		for i := range maxSessions + 10 {
			s.create(capability.Principal{KeyID: fmt.Sprintf("key_%d", i)})
		}
		if n := s.len(); n > maxSessions {
			t.Errorf("sessions held: got %d, want at most %d", n, maxSessions)
		}
	})
	t.Run("revoking a key ends its sessions", func(t *testing.T) {
		a, _ := s.create(p)
		b, _ := s.create(p)
		other, _ := s.create(capability.Principal{KeyID: "key_b"})
		s.endKey("key_a")
		if s.get(a) != nil || s.get(b) != nil {
			t.Error("a session of the revoked key is still live")
		}
		if s.get(other) == nil {
			t.Error("another key's session ended too")
		}
	})
}
