package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/capability"
)

// Sign-ins live in memory, in a bounded table, and end with the daemon:
// after a restart everyone signs in again. A browser holds only a random
// token (the cookie); the table keeps its SHA-256, the key's id, never the
// key, and the session's CSRF token. Every request checks the key again
// in the store (Console.visit), so a revoked key ends its sessions at
// their next request, and a live page's event stream within Recheck.
const (
	// maxSessions bounds the table; a sign-in beyond it ends the session
	// that would expire first.
	maxSessions = 1024
	// maxSessionsPerKey bounds one key's sessions, so that one key cannot
	// fill the table: its oldest session ends.
	maxSessionsPerKey = 8
)

// session is one sign-in.
type session struct {
	key     [sha256.Size]byte // SHA-256 of the cookie's token
	csrf    string
	p       capability.Principal
	created time.Time
	expires time.Time
}

// sessions is the sign-in table. It is safe for concurrent use.
type sessions struct {
	ttl time.Duration
	now func() time.Time

	mu   sync.Mutex
	byID map[[sha256.Size]byte]*session
}

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, now: now, byID: map[[sha256.Size]byte]*session{}}
}

// randomToken returns 32 random bytes, base64url-encoded.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

// create starts a session for p and returns the token its cookie holds.
func (s *sessions) create(p capability.Principal) (string, *session) {
	token := randomToken()
	now := s.now()
	sess := &session{key: sha256.Sum256([]byte(token)), csrf: randomToken(), p: p, created: now, expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune(now)
	var oldestOfKey, first *session
	n := 0
	for _, o := range s.byID {
		if o.p.KeyID == p.KeyID {
			n++
			if oldestOfKey == nil || o.created.Before(oldestOfKey.created) {
				oldestOfKey = o
			}
		}
		if first == nil || o.expires.Before(first.expires) {
			first = o
		}
	}
	switch {
	case n >= maxSessionsPerKey:
		delete(s.byID, oldestOfKey.key)
	case len(s.byID) >= maxSessions:
		delete(s.byID, first.key)
	}
	s.byID[sess.key] = sess
	return token, sess
}

// prune removes expired sessions. Called with mu held.
func (s *sessions) prune(now time.Time) {
	for k, o := range s.byID {
		if !now.Before(o.expires) {
			delete(s.byID, k)
		}
	}
}

// get returns the live session of token, or nil.
func (s *sessions) get(token string) *session {
	if token == "" {
		return nil
	}
	k := sha256.Sum256([]byte(token))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.byID[k]
	if sess != nil && !s.now().Before(sess.expires) {
		delete(s.byID, k)
		return nil
	}
	return sess
}

// end ends one session.
func (s *sessions) end(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, sess.key)
}

// endKey ends every session of the key keyID: it was revoked.
func (s *sessions) endKey(keyID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, o := range s.byID {
		if o.p.KeyID == keyID {
			delete(s.byID, k)
		}
	}
}

// live reports whether sess is still in the table and unexpired.
func (s *sessions) live(sess *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[sess.key] == sess && s.now().Before(sess.expires)
}

func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// sameToken compares two tokens in constant time.
func sameToken(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
