package e2b

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// watchPoll is how often WatchDir looks at the directory: the files path
// has no notification, so a watch compares listings.
const watchPoll = 250 * time.Millisecond

// watchRequest is filesystem.WatchDirRequest.
type watchRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

// fileState is what a watch compares of an entry.
type fileState struct {
	typ  sandbox.FileType
	size int64
	mod  time.Time
}

// watchDir serves WatchDir: a start event, then an event per entry
// created, written or removed below the directory (relative names, as
// envd sends them), found by comparing its listings every watchPoll,
// with keepalives, until the client goes away or the request's
// Connect-Timeout-Ms passes.
func (s *Server) watchDir(w http.ResponseWriter, r *http.Request, t Target) {
	var req watchRequest
	if err := rpcRequest(r, true, &req); err != nil {
		openStream(w).end(err)
		return
	}
	inner, _, err := sandboxPath(req.Path)
	if err != nil {
		openStream(w).end(err)
		return
	}
	ctx := r.Context()
	if d, err := connectTimeout(r); err != nil {
		openStream(w).end(err)
		return
	} else if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	depth := 1
	if req.Recursive {
		depth = maxListDepth
	}
	before, err := s.snapshot(ctx, t, inner, depth)
	if err != nil {
		openStream(w).end(err)
		return
	}
	st := openStream(w)
	if st.send(map[string]any{"start": map[string]any{}}) != nil {
		return
	}
	interval := 30 * time.Second
	if v, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		interval = min(time.Duration(v)*time.Second, maxKeepalive)
	}
	keep := time.NewTicker(interval)
	defer keep.Stop()
	poll := time.NewTicker(watchPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			if context.Cause(ctx) == ErrSandboxGone {
				st.end(&rpcError{Code: "unavailable", Message: "the sandbox was killed or paused"})
				return
			}
			st.end(nil)
			return
		case <-keep.C:
			if st.send(map[string]any{"keepalive": map[string]any{}}) != nil {
				return
			}
		case <-poll.C:
			now, err := s.snapshot(ctx, t, inner, depth)
			if err != nil {
				if ctx.Err() != nil {
					continue
				}
				st.end(err)
				return
			}
			for _, ev := range diffStates(before, now) {
				if st.send(map[string]any{"filesystem": ev}) != nil {
					return
				}
			}
			before = now
		}
	}
}

// snapshot lists dir down to depth: each entry's state by its name
// relative to dir.
func (s *Server) snapshot(ctx context.Context, t Target, dir string, depth int) (map[string]fileState, error) {
	out := map[string]fileState{}
	var walk func(rel string, depth int) error
	walk = func(rel string, depth int) error {
		p := dir
		if rel != "" {
			p = dir + "/" + rel
		}
		fis, _, err := s.svc.ListFiles(ctx, t.Principal, t.SessionID, p)
		if err != nil {
			return err
		}
		for _, fi := range fis {
			if len(out) >= sandbox.MaxListEntries {
				return nil
			}
			name := fi.Name
			if rel != "" {
				name = rel + "/" + fi.Name
			}
			out[name] = fileState{typ: fi.Type, size: fi.Size, mod: fi.ModTime}
			if fi.Type == sandbox.TypeDir && depth > 1 {
				if err := walk(name, depth-1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk("", depth)
}

// diffStates is the filesystem events from before to now: created,
// written (size or time changed) and removed entries.
func diffStates(before, now map[string]fileState) []map[string]string {
	var out []map[string]string
	for name, st := range now {
		old, ok := before[name]
		switch {
		case !ok:
			out = append(out, map[string]string{"name": name, "type": "EVENT_TYPE_CREATE"})
		case st.typ == sandbox.TypeFile && (st.size != old.size || !st.mod.Equal(old.mod)):
			out = append(out, map[string]string{"name": name, "type": "EVENT_TYPE_WRITE"})
		}
	}
	for name := range before {
		if _, ok := now[name]; !ok {
			out = append(out, map[string]string{"name": name, "type": "EVENT_TYPE_REMOVE"})
		}
	}
	return out
}
