package store

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"strconv"
	"time"

	"github.com/stockade-sh/stockade/model"
)

// chainDomain separates audit hashes from any other SHA-256 use, and names
// the encoding's version.
const chainDomain = "stockade.audit.v1"

// ChainTimeFormat is how an event's time enters its hash: UTC, microseconds.
const ChainTimeFormat = "2006-01-02T15:04:05.000000Z"

// ChainHash returns the lower-case hex SHA-256 that links e into its chain.
// It covers every field of e except Hash itself, in this canonical encoding,
// so that anyone holding an export of the rows can recompute it:
//
//	"stockade.audit.v1", then for each of workspace id, seq (decimal), event
//	id, time (ChainTimeFormat), type, code, actor, reason, execution id, data,
//	prev hash: its length as a big-endian uint64 followed by its bytes.
//
// Length prefixes make the encoding injective: no two different events
// encode alike, whatever bytes their fields hold.
func ChainHash(e model.Event) string {
	h := sha256.New()
	h.Write([]byte(chainDomain))
	for _, f := range []string{
		e.WorkspaceID,
		strconv.FormatInt(e.Seq, 10),
		e.ID,
		e.Time.UTC().Format(ChainTimeFormat),
		e.Type,
		e.Code,
		e.Actor,
		e.Reason,
		e.ExecutionID,
		string(e.Data),
		e.PrevHash,
	} {
		writeField(h, f)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func writeField(h hash.Hash, f string) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(f)))
	h.Write(n[:])
	h.Write([]byte(f))
}

// TruncateTime normalises a time the way every Store stores it: UTC,
// microsecond precision.
func TruncateTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Truncate(time.Microsecond)
}

// ChainVerifier checks a chain fed to it in Seq order. It is the reference
// verifier: stores use it in VerifyChain, and an auditor can run it over an
// export. The zero value is not ready; use NewChainVerifier.
type ChainVerifier struct {
	workspace string
	next      int64
	prevHash  string
	broken    *model.BrokenLink
	witnessed *model.ChainHead
	// resumed is set when the walk starts at the witnessed head rather
	// than at seq 1 (NewChainVerifierFrom): the witnessed event's own
	// link backwards is not checked.
	resumed bool
}

// NewChainVerifier returns a verifier for the chain of workspaceID.
func NewChainVerifier(workspaceID string) *ChainVerifier {
	return &ChainVerifier{workspace: workspaceID, next: 1}
}

// NewChainVerifierFrom returns a verifier that checks the chain of
// from.WorkspaceID onwards from from, a head of it witnessed earlier
// outside the database (see Witnessed), without walking the events before
// it: fed the events from from.Seq on, it checks that the event at
// from.Seq is the one witnessed and that each later one links to it. That
// is what a witness must know before it moves on to a later head: a chain
// rewritten from some event at or before from.Seq, however consistently,
// no longer holds the witnessed event. The events before from.Seq are
// left to a full walk (NewChainVerifier). A from with Seq 0 (nothing
// witnessed yet) walks the whole chain.
func NewChainVerifierFrom(from model.ChainHead) *ChainVerifier {
	if from.Seq <= 0 {
		return NewChainVerifier(from.WorkspaceID)
	}
	v := &ChainVerifier{workspace: from.WorkspaceID, next: from.Seq, resumed: true}
	v.Witnessed(from)
	return v
}

// Witnessed makes the verifier check the chain against h, a head of it
// recorded outside the database (see ChainHead): the chain must still hold
// that event, unchanged. This catches what the chain alone cannot, an
// attacker who removes its last events and rewinds its recorded head, or
// rewrites it whole from some event on.
func (v *ChainVerifier) Witnessed(h model.ChainHead) { v.witnessed = &h }

// Add checks the next event of the chain. It returns false once the chain is
// broken; later events are then ignored.
func (v *ChainVerifier) Add(e model.Event) bool {
	if v.broken != nil {
		return false
	}
	switch {
	case e.WorkspaceID != v.workspace:
		v.fail(v.next, e.ID, fmt.Sprintf("event belongs to workspace %q", e.WorkspaceID))
	case e.Seq > v.next:
		v.fail(v.next, "", fmt.Sprintf("event %d is missing (deleted?): the next row has seq %d", v.next, e.Seq))
	case e.Seq < v.next:
		v.fail(e.Seq, e.ID, fmt.Sprintf("seq %d repeats or goes backwards (inserted?)", e.Seq))
	case e.PrevHash != v.prevHash && !(v.resumed && e.Seq == v.witnessed.Seq):
		v.fail(e.Seq, e.ID, "prev_hash does not match the hash of the previous event (previous row changed, removed or inserted)")
	case ChainHash(e) != e.Hash:
		v.fail(e.Seq, e.ID, "hash mismatch: the row's contents were changed")
	case v.witnessed != nil && e.Seq == v.witnessed.Seq && e.Hash != v.witnessed.Hash:
		v.fail(e.Seq, e.ID, "the event differs from the one witnessed outside the database: the chain was rewritten from here on")
	default:
		v.next++
		v.prevHash = e.Hash
		return true
	}
	return false
}

// Finish compares the chain walked so far with its recorded head and returns
// the verdict.
func (v *ChainVerifier) Finish(head model.ChainHead) (bool, *model.BrokenLink) {
	if v.broken != nil {
		return false, v.broken
	}
	last := v.next - 1
	switch {
	case v.resumed && last < v.witnessed.Seq:
		// Walked from the witnessed head, a chain that no longer reaches
		// it has no event to compare with the recorded head.
		v.fail(last+1, "", fmt.Sprintf("the chain holds no event at seq %d, the head witnessed outside the database (its recorded head is seq %d): events were removed and the head rewound", v.witnessed.Seq, head.Seq))
	case head.Seq > last:
		v.fail(last+1, "", fmt.Sprintf("event %d is missing (deleted?): the chain head records seq %d", last+1, head.Seq))
	case head.Seq < last:
		v.fail(head.Seq+1, "", fmt.Sprintf("events past the recorded head seq %d (inserted?)", head.Seq))
	case head.Hash != v.prevHash:
		v.fail(last, "", "the last event's hash differs from the recorded chain head")
	case v.witnessed != nil && last < v.witnessed.Seq:
		v.fail(last+1, "", fmt.Sprintf("the chain ends at seq %d, before the head witnessed outside the database at seq %d: events were removed and the head rewound", last, v.witnessed.Seq))
	default:
		return true, nil
	}
	return false, v.broken
}

func (v *ChainVerifier) fail(seq int64, id, reason string) {
	v.broken = &model.BrokenLink{WorkspaceID: v.workspace, Seq: seq, EventID: id, Reason: reason}
}
