package capability

import (
	"context"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// QuotaError is a session refused because its workspace has as many live
// sessions as it may (429 session_quota, with Retry-After); it is of class
// ErrResourceExhausted.
type QuotaError struct {
	Max int
	// RetryAfter is when the first of the workspace's sessions is due to
	// end by itself.
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("the workspace has %d live sessions, its most; close one (DELETE /v1/sessions/{id}) or retry later", e.Max)
}
func (e *QuotaError) Unwrap() error { return errdefs.ErrResourceExhausted }

// maxSessions is the bound of the live sessions of a workspace under pol.
func (s *sessionHost) maxSessions(pol model.Policy) int {
	if pol.MaxSessions > 0 {
		return min(pol.MaxSessions, s.opts.Sessions.MaxPerWorkspace)
	}
	return s.opts.Sessions.MaxPerWorkspace
}

// sessionRoom is the bound of the live sessions of workspace ws under
// pol, and whether n more fit under it. It is the one count that what
// opens sessions asks before it starts them: an opening (openingClaim,
// n 1) and a fork (roomFor, n its count); the store counts again as it
// records each session (store.NewSession.MaxLive).
func (s *sessionHost) sessionRoom(ctx context.Context, ws string, pol model.Policy, n int) (most int, fits bool, err error) {
	most = s.maxSessions(pol)
	live, err := s.st.CountActiveSessions(ctx, ws)
	if err != nil {
		return most, false, err
	}
	return most, live+n <= most, nil
}

// refuseQuota records the refusal of a session over the workspace's
// bound and answers with a QuotaError saying when to retry.
func (s *sessionHost) refuseQuota(ctx context.Context, c *claim, in Admit, most int) error {
	err := s.gate.refuse(ctx, c, in, &Refusal{Code: "session_quota", Reason: fmt.Sprintf("the workspace has %d live sessions, its most", most), Class: errdefs.ErrResourceExhausted})
	if !errdefs.IsResourceExhausted(err) {
		return err
	}
	retry := time.Minute
	page, err := s.st.ListSessions(ctx, c.by.WorkspaceID, store.SessionFilter{States: []model.SessionState{model.SessionActive, model.SessionPaused},
		PageRequest: store.PageRequest{Limit: store.MaxPageLimit}})
	if err == nil {
		now := s.opts.Now()
		for _, ss := range page.Items {
			retry = min(retry, ss.ExpiresAt.Sub(now))
			if ss.State == model.SessionActive {
				retry = min(retry, ss.IdleExpiresAt().Sub(now)) // a paused one does not idle out
			}
		}
	}
	return errdefs.Public(&QuotaError{Max: most, RetryAfter: max(retry, time.Second)})
}
