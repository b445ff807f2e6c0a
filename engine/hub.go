package engine

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
