package capability

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/model"
)

// keyring authenticates API keys and records their last uses.
type keyring struct {
	*core
	st keyStore
	// keyUses are the API keys' uses not yet written to the store.
	keyUses keyUses
}

// keyStore is what keyring needs of the store.
type keyStore interface {
	LookupAPIKey(ctx context.Context, hash model.KeyHash) (model.APIKey, error)
	// RecordKeyUses writes the API keys' last uses, in batches.
	RecordKeyUses(ctx context.Context, uses map[string]time.Time) error
}

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
func (s *keyring) flushKeyUses(ctx context.Context) {
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

// Authenticate resolves a bearer key. Unknown and revoked keys are
// ErrUnauthenticated.
func (s *keyring) Authenticate(ctx context.Context, key string) (p Principal, err error) {
	ctx, sp := telemetry.Start(ctx, telemetry.Authenticate)
	defer sp.End(&err)
	if key == "" {
		return Principal{}, errdefs.Publicf("missing API key (send Authorization: Bearer KEY): %w", errdefs.ErrUnauthenticated)
	}
	k, err := s.st.LookupAPIKey(ctx, model.HashKey(key))
	if errdefs.IsNotFound(err) {
		return Principal{}, errdefs.Publicf("invalid or revoked API key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		// Anyone may send a key: the answer says nothing of the database
		// (a connection error names its host, user and database). The
		// message is not public: the API answers its class's sentence and
		// logs it.
		return Principal{}, fmt.Errorf("looking up an API key: %w", err)
	}
	s.keyUses.note(k.ID, s.opts.Now())
	return Principal{KeyID: k.ID, WorkspaceID: k.WorkspaceID, Role: k.Role}, nil
}
