package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// change is a Change as the page's script receives it.
type change struct {
	Kind        string `json:"kind"`
	ApprovalID  string `json:"approval_id,omitempty"`
	ExecutionID string `json:"execution_id"`
}

// events streams the workspace's changes to a live page (Server-Sent
// Events): "ready" when the stream starts (a page that reconnects reloads
// what it shows, having maybe missed changes), "change" with the ids of
// what changed (the page fetches its new rendering, which checks the
// session again), "resync" when the stream fell behind and the page must
// reload what it shows, and "signed_out" when the key was revoked or the
// session expired, after which the stream ends. The stream carries ids
// only, never a record.
func (c *Console) events(w http.ResponseWriter, r *http.Request, v *visit) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		c.errorPage(w, r, http.StatusNotImplemented, "This connection cannot stream events.")
		return
	}
	// A stream lasts as long as the page; the server's write deadline, if
	// any, is for other answers.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	changes, cancel := c.svc.Watch(v.key.WorkspaceID)
	defer func() { cancel() }()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(event string, data any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
		flusher.Flush()
	}
	fmt.Fprint(w, "retry: 2000\n")
	send("ready", struct{}{})
	recheck := time.NewTicker(c.opts.Recheck)
	defer recheck.Stop()
	expiry := time.NewTimer(v.sess.expires.Sub(c.opts.Now()))
	defer expiry.Stop()
	for {
		select {
		case ch, ok := <-changes:
			if !ok {
				changes, cancel = c.svc.Watch(v.key.WorkspaceID)
				send("resync", struct{}{})
				continue
			}
			send("change", change{Kind: string(ch.Kind), ApprovalID: ch.ApprovalID, ExecutionID: ch.ExecutionID})
		case <-recheck.C:
			_, err := c.check(r.Context(), v.sess)
			if _, out := err.(errSignedOut); out {
				send("signed_out", struct{}{})
				return
			}
			if err != nil {
				// The store is down for a moment: the next check decides.
				c.log.Warn("checking a console session", "err", err)
			}
			fmt.Fprint(w, ": keep-alive\n\n")
			flusher.Flush()
		case <-expiry.C:
			c.sessions.end(v.sess)
			send("signed_out", struct{}{})
			return
		case <-r.Context().Done():
			return
		}
	}
}
