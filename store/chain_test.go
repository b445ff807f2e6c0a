package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

func goldenEvent() model.Event {
	return model.Event{ID: "evt_1", WorkspaceID: "ws_1", Seq: 1, Type: "capability.invoke_allowed", Code: "CAP001",
		Actor: "key_1", Reason: "policy allows", ExecutionID: "ex_1", Data: []byte(`{"runtime":"python"}`),
		Time: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)}
}

// TestChainHashGolden pins the canonical encoding: changing it breaks every
// stored chain, so it may only change with a new domain version. The value
// was computed independently from the documented encoding.
func TestChainHashGolden(t *testing.T) {
	const want = "8bbea2b41409d89525e8f912dc84ecfccbf65da3ff3688e9815c1438993e0654"
	if got := store.ChainHash(goldenEvent()); got != want {
		t.Fatalf("ChainHash: got %s, want %s", got, want)
	}
	e := goldenEvent()
	e.Time = e.Time.In(time.FixedZone("elsewhere", -7*3600))
	if got := store.ChainHash(e); got != want {
		t.Fatalf("ChainHash depends on the time zone: got %s", got)
	}
}

// TestChainHashCoversEveryField changes one field at a time, including
// shifting bytes between neighbouring fields, which a plain concatenation
// would not notice.
func TestChainHashCoversEveryField(t *testing.T) {
	base := store.ChainHash(goldenEvent())
	for _, tc := range []struct {
		name string
		mod  func(e *model.Event)
	}{
		{"workspace", func(e *model.Event) { e.WorkspaceID = "ws_2" }},
		{"seq", func(e *model.Event) { e.Seq = 2 }},
		{"id", func(e *model.Event) { e.ID = "evt_2" }},
		{"time", func(e *model.Event) { e.Time = e.Time.Add(time.Microsecond) }},
		{"type", func(e *model.Event) { e.Type = "capability.invoke_denied" }},
		{"code", func(e *model.Event) { e.Code = "CAP002" }},
		{"actor", func(e *model.Event) { e.Actor = "key_2" }},
		{"reason", func(e *model.Event) { e.Reason = "policy allows." }},
		{"execution", func(e *model.Event) { e.ExecutionID = "ex_2" }},
		{"data", func(e *model.Event) { e.Data = []byte(`{"runtime":"node"}`) }},
		{"prev hash", func(e *model.Event) { e.PrevHash = "00" }},
		{"bytes moved between fields", func(e *model.Event) { e.Code, e.Actor = "CAP001k", "ey_1" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := goldenEvent()
			tc.mod(&e)
			if store.ChainHash(e) == base {
				t.Fatalf("changing %s left the hash unchanged", tc.name)
			}
		})
	}
}

func chain(n int) []model.Event {
	var out []model.Event
	prev := ""
	for i := 1; i <= n; i++ {
		e := goldenEvent()
		e.Seq, e.PrevHash = int64(i), prev
		e.Hash = store.ChainHash(e)
		prev = e.Hash
		out = append(out, e)
	}
	return out
}

func TestChainVerifier(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mod     func(es []model.Event) ([]model.Event, model.ChainHead)
		wantSeq int64 // 0: intact
	}{
		{"intact", func(es []model.Event) ([]model.Event, model.ChainHead) { return es, head(es) }, 0},
		{"empty", func([]model.Event) ([]model.Event, model.ChainHead) { return nil, model.ChainHead{} }, 0},
		{"edited row", func(es []model.Event) ([]model.Event, model.ChainHead) {
			es[2].Reason = "edited"
			return es, head(es)
		}, 3},
		{"edited and rehashed row", func(es []model.Event) ([]model.Event, model.ChainHead) {
			es[2].Reason = "edited"
			es[2].Hash = store.ChainHash(es[2])
			return es, head(es)
		}, 4},
		{"deleted row", func(es []model.Event) ([]model.Event, model.ChainHead) {
			return append(es[:1:1], es[2:]...), head(es)
		}, 2},
		{"deleted tail", func(es []model.Event) ([]model.Event, model.ChainHead) { return es[:3], head(es) }, 4},
		{"deleted first row", func(es []model.Event) ([]model.Event, model.ChainHead) { return es[1:], head(es) }, 1},
		{"row past the head", func(es []model.Event) ([]model.Event, model.ChainHead) { return es, head(es[:4]) }, 5},
		{"head hash differs", func(es []model.Event) ([]model.Event, model.ChainHead) {
			h := head(es)
			h.Hash = "beef"
			return es, h
		}, 5},
		{"repeated seq", func(es []model.Event) ([]model.Event, model.ChainHead) {
			return append(es[:3:3], es[2:]...), head(es)
		}, 3},
		{"another workspace's row", func(es []model.Event) ([]model.Event, model.ChainHead) {
			es[1].WorkspaceID = "ws_other"
			return es, head(es)
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es, h := tc.mod(chain(5))
			verdict(t, store.NewChainVerifier("ws_1"), es, h, tc.wantSeq)
		})
	}
}

// TestChainVerifierFrom checks the walk from a witnessed head: it sees a
// chain rewritten at or before the head, however consistently, and what
// changed after it, but not what changed before it (a full walk's job).
func TestChainVerifierFrom(t *testing.T) {
	// rewrite rebuilds the chain from seq on, consistently: other events,
	// each hashed and linked to the one before.
	rewrite := func(es []model.Event, seq int) []model.Event {
		for i := seq - 1; i < len(es); i++ {
			es[i].Reason = "forged"
			if i > 0 {
				es[i].PrevHash = es[i-1].Hash
			}
			es[i].Hash = store.ChainHash(es[i])
		}
		return es
	}
	for _, tc := range []struct {
		name    string
		mod     func(es []model.Event) ([]model.Event, model.ChainHead)
		wantSeq int64 // 0: intact
	}{
		{"intact", func(es []model.Event) ([]model.Event, model.ChainHead) { return es, head(es) }, 0},
		{"no event past the witness", func(es []model.Event) ([]model.Event, model.ChainHead) { return es[:5], head(es[:5]) }, 0},
		{"edited before the witness", func(es []model.Event) ([]model.Event, model.ChainHead) {
			es[1].Reason = "edited"
			return es, head(es)
		}, 0},
		{"rewritten from before the witness and padded past it", func(es []model.Event) ([]model.Event, model.ChainHead) {
			es = rewrite(es, 3)
			return es, head(es)
		}, 5},
		{"rewritten from the witness on", func(es []model.Event) ([]model.Event, model.ChainHead) {
			es = rewrite(es, 5)
			return es, head(es)
		}, 5},
		{"edited after the witness", func(es []model.Event) ([]model.Event, model.ChainHead) {
			es[6].Reason = "edited"
			return es, head(es)
		}, 7},
		{"relinked after the witness", func(es []model.Event) ([]model.Event, model.ChainHead) {
			es[5].PrevHash = "beef"
			es[5].Hash = store.ChainHash(es[5])
			return es, head(es)
		}, 6},
		{"rewound below the witness", func(es []model.Event) ([]model.Event, model.ChainHead) { return es[:4], head(es[:4]) }, 5},
		{"witnessed event removed", func(es []model.Event) ([]model.Event, model.ChainHead) {
			return append(es[:4:4], es[5:]...), head(es)
		}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es := chain(8)
			from := head(es[:5])
			es, h := tc.mod(es)
			// Fed as a store feeds it: the events from the witnessed seq on.
			es = slices.DeleteFunc(es, func(e model.Event) bool { return e.Seq < from.Seq })
			verdict(t, store.NewChainVerifierFrom(from), es, h, tc.wantSeq)
		})
	}
	t.Run("nothing witnessed yet: the whole chain is walked", func(t *testing.T) {
		es := chain(3)
		es[0].Reason = "edited"
		verdict(t, store.NewChainVerifierFrom(model.ChainHead{WorkspaceID: "ws_1"}), es, head(es), 1)
	})
}

// verdict feeds v the events es and fails t unless it finds the chain
// intact against head (wantSeq 0) or broken at wantSeq.
func verdict(t *testing.T, v *store.ChainVerifier, es []model.Event, head model.ChainHead, wantSeq int64) {
	t.Helper()
	for _, e := range es {
		if !v.Add(e) {
			break
		}
	}
	ok, broken := v.Finish(head)
	switch {
	case wantSeq == 0 && (!ok || broken != nil):
		t.Fatalf("got break %+v, want an intact chain", broken)
	case wantSeq != 0 && (ok || broken == nil):
		t.Fatalf("got an intact chain, want a break at %d", wantSeq)
	case wantSeq != 0 && broken.Seq != wantSeq:
		t.Fatalf("got break %+v, want one at seq %d", broken, wantSeq)
	}
}

func head(es []model.Event) model.ChainHead {
	last := es[len(es)-1]
	return model.ChainHead{WorkspaceID: last.WorkspaceID, Seq: last.Seq, Hash: last.Hash}
}

// TestExecutionStatus checks which statuses are terminal; what each
// costs is the capability layer's rule (capability.TestCharging).
func TestExecutionStatus(t *testing.T) {
	for _, s := range model.ExecutionStatuses {
		live := s == model.StatusQueued || s == model.StatusAwaitingApproval || s == model.StatusRunning
		if s.Terminal() == live {
			t.Errorf("%s: Terminal() = %v", s, s.Terminal())
		}
	}
	if model.ExecutionStatus("bogus").Terminal() {
		t.Error("an unknown status is terminal")
	}
}
