package capability

import (
	"encoding/json"
	"sync"
)

// StreamEvent is one event of a running execution, as sent over SSE.
type StreamEvent struct {
	Type string // "started", "stdout", "stderr"
	Data json.RawMessage
}

// subscriberBuffer bounds the events queued for one subscriber. Output is
// capped per stream, so this holds a whole capped run in 32 KiB chunks; a
// subscriber that falls further behind loses chunks, never the result
// (which is read from the store when the channel closes).
const subscriberBuffer = 256

// hub fans an execution's events out to its subscribers.
type hub struct {
	mu   sync.Mutex
	subs map[string]map[chan StreamEvent]struct{}
}

func newHub() *hub { return &hub{subs: map[string]map[chan StreamEvent]struct{}{}} }

func (h *hub) subscribe(id string) chan StreamEvent {
	ch := make(chan StreamEvent, subscriberBuffer)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[id] == nil {
		h.subs[id] = map[chan StreamEvent]struct{}{}
	}
	h.subs[id][ch] = struct{}{}
	return ch
}

func (h *hub) unsubscribe(id string, ch chan StreamEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[id][ch]; ok {
		delete(h.subs[id], ch)
		close(ch)
		if len(h.subs[id]) == 0 {
			delete(h.subs, id)
		}
	}
}

// publish delivers ev to every subscriber of id without blocking.
func (h *hub) publish(id string, ev StreamEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[id] {
		select {
		case ch <- ev:
		default:
		}
	}
}

// finish closes every subscription of id: the execution has ended.
func (h *hub) finish(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[id] {
		close(ch)
	}
	delete(h.subs, id)
}

// Change says that an approval or an execution of a workspace changed: an
// approval was requested, decided or expired, an execution started or
// ended. It names the records, not their new state, which the watcher reads
// from the store; a watcher that reads late sees a later state, never an
// older one.
type Change struct {
	Kind        ChangeKind
	WorkspaceID string
	// ApprovalID is empty for an execution that needed no approval.
	ApprovalID  string
	ExecutionID string
}

// watcherBuffer bounds the changes queued for one watcher; one that falls
// further behind is dropped (see Service.Watch).
const watcherBuffer = 64

// feed fans each workspace's changes out to its watchers.
type feed struct {
	mu       sync.Mutex
	watchers map[string]map[chan Change]struct{}
}

func newFeed() *feed { return &feed{watchers: map[string]map[chan Change]struct{}{}} }

func (f *feed) watch(ws string) chan Change {
	ch := make(chan Change, watcherBuffer)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.watchers[ws] == nil {
		f.watchers[ws] = map[chan Change]struct{}{}
	}
	f.watchers[ws][ch] = struct{}{}
	return ch
}

// drop ends ch's watch, closing it, unless it has ended already.
func (f *feed) drop(ws string, ch chan Change) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropLocked(ws, ch)
}

func (f *feed) dropLocked(ws string, ch chan Change) {
	if _, ok := f.watchers[ws][ch]; !ok {
		return
	}
	delete(f.watchers[ws], ch)
	close(ch)
	if len(f.watchers[ws]) == 0 {
		delete(f.watchers, ws)
	}
}

// publish delivers c to every watcher of its workspace without blocking; a
// watcher whose buffer is full is dropped, so that it learns it missed
// changes instead of missing them silently.
func (f *feed) publish(c Change) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.watchers[c.WorkspaceID] {
		select {
		case ch <- c:
		default:
			f.dropLocked(c.WorkspaceID, ch)
		}
	}
}
