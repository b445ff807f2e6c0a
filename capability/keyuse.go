package capability

import (
	"context"
	"sync"
	"time"
)

// keyUses holds the last use of each API key that authenticated since the
// last flush. Authenticating only notes the use here, under a mutex held
// for one map write, so that it never waits for the database's writer;
// the service's tick writes the batch (store.Keys.RecordKeyUses) once a
// second and at Close. The zero value is ready to use and safe for
// concurrent use.
type keyUses struct {
	mu   sync.Mutex
	uses map[string]time.Time
}

// note records that the key id was used at at.
func (k *keyUses) note(id string, at time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.uses == nil {
		k.uses = map[string]time.Time{}
	}
	if at.After(k.uses[id]) {
		k.uses[id] = at
	}
}

// take returns the uses noted since the last take, and forgets them.
func (k *keyUses) take() map[string]time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	u := k.uses
	k.uses = nil
	return u
}

// flushKeyUses writes the uses noted since the last flush. A batch the
// store refuses is noted again, for the next flush: a use is recorded
// late, never lost while the daemon runs.
func (s *Service) flushKeyUses(ctx context.Context) {
	uses := s.keyUses.take()
	if len(uses) == 0 {
		return
	}
	if err := s.st.RecordKeyUses(ctx, uses); err != nil {
		s.log.Warn("recording the last use of API keys; trying again at the next tick", "keys", len(uses), "err", err)
		for id, at := range uses {
			s.keyUses.note(id, at)
		}
	}
}
