// Package audit defines Stockade's audit events: one struct per event type,
// with its type (what happened) and its stable code (for queries and alerts
// that must survive a rename) as constants beside it, as in Teleport's
// api/types/events and lib/events/codes.go. Every struct embeds Meta, what
// every event has; the rest of its fields are its data, and the JSON of the
// struct is what the workspace's tamper-evident chain (store.Audit) holds
// and hashes, byte for byte.
//
// NewEvent is the only way from an event to the store's input, so that every
// event in a chain is the encoding of its struct:
//
//	_, err := st.AppendEvent(ctx, audit.NewEvent(audit.ToolReviewApprovedEvent{
//		Meta: audit.Meta{WorkspaceID: ws, Actor: keyID, Reason: reason},
//		Tool: t.Name, Fingerprint: fp,
//	}))
//
// The JSON of an event type never changes shape once written: a field may be
// added only where omitempty keeps the events already written as they are.
// Fields are in the order of their keys, as the maps they replace encoded
// them.
package audit

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
)

// Meta is what every event has besides its data. It is stored in the
// event's own columns, never in its data.
type Meta struct {
	// WorkspaceID names the chain; empty is the unattributed chain. The
	// store sets it for the events it appends with a change of a
	// workspace's records (an admission, a decision, a cancel, ...).
	WorkspaceID string
	// Actor is who caused the event: an API key id, "system" or "cli".
	Actor string
	// Reason says why, in words.
	Reason string
	// ExecutionID is the execution the event is about; the store sets it
	// for the events of a change of an execution.
	ExecutionID string
	// Time is when it happened; zero means the store's clock.
	Time time.Time
}

// Metadata returns m; every event has it through its embedded Meta.
func (m Meta) Metadata() Meta { return m }

func (m *Meta) setMetadata(v Meta) { *m = v }

// Event is an audit event: one of this package's structs.
type Event interface {
	// Type is the event's name, e.g. "capability.invoke_denied".
	Type() string
	// Code is the event's stable code, e.g. "CAP002W".
	Code() string
	Metadata() Meta
}

// dataless is an event that has no data: it is stored without any (NULL),
// as it always was.
type dataless interface{ dataless() }

// NewEvent returns the store's input for e: its type, code and metadata,
// and as its data the JSON of e (its fields besides Meta). It panics if e
// cannot be encoded, which only a json.RawMessage field holding invalid
// JSON can cause: those hold what Stockade encoded itself.
func NewEvent(e Event) model.NewEvent {
	m := e.Metadata()
	ne := model.NewEvent{WorkspaceID: m.WorkspaceID, Type: e.Type(), Code: e.Code(), Actor: m.Actor,
		Reason: m.Reason, ExecutionID: m.ExecutionID, Time: m.Time}
	if _, ok := e.(dataless); ok {
		return ne
	}
	b, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("audit: encoding a %s event: %v", e.Type(), err))
	}
	ne.Data = b
	return ne
}

// NewEvents returns the store's inputs for es, in order (see NewEvent).
func NewEvents(es ...Event) []model.NewEvent {
	out := make([]model.NewEvent, len(es))
	for i, e := range es {
		out[i] = NewEvent(e)
	}
	return out
}

// ErrUnknownType is returned by Decode for an event of a type this package
// does not define (one written by a test, or by a later version). It is
// of the class ErrInvalidArgument.
var ErrUnknownType = fmt.Errorf("unknown audit event type: %w", errdefs.ErrInvalidArgument)

// Decode returns the struct of a stored event, its Meta from e's columns
// and its fields from e's data. An event of an unknown type is
// ErrUnknownType; data that does not fit its type's struct is
// ErrInvalidArgument too.
func Decode(e model.Event) (Event, error) {
	dec, ok := decoders[e.Type]
	if !ok {
		return nil, fmt.Errorf("decoding event %s of type %q: %w", e.ID, e.Type, ErrUnknownType)
	}
	ev, err := dec(e.Data, Meta{WorkspaceID: e.WorkspaceID, Actor: e.Actor, Reason: e.Reason, ExecutionID: e.ExecutionID, Time: e.Time})
	if err != nil {
		return nil, fmt.Errorf("decoding %s event %s: %v: %w", e.Type, e.ID, err, errdefs.ErrInvalidArgument)
	}
	return ev, nil
}

// decoders maps every event type to the decoder of its struct.
var decoders = map[string]func(data []byte, m Meta) (Event, error){
	InvokeAllowed:          decoder[InvokeAllowedEvent],
	InvokeDenied:           decoder[InvokeDeniedEvent],
	ApprovalRequested:      decoder[ApprovalRequestedEvent],
	ApprovalApproved:       decoder[ApprovalApprovedEvent],
	ApprovalDenied:         decoder[ApprovalDeniedEvent],
	ApprovalExpired:        decoder[ApprovalExpiredEvent],
	ExecutionFinished:      decoder[ExecutionFinishedEvent],
	ExecutionRecovered:     decoder[ExecutionRecoveredEvent],
	ExecutionCancelled:     decoder[ExecutionCancelledEvent],
	ToolRegistered:         decoder[ToolRegisteredEvent],
	ToolChanged:            decoder[ToolChangedEvent],
	ToolRemoved:            decoder[ToolRemovedEvent],
	ToolReviewApproved:     decoder[ToolReviewApprovedEvent],
	EgressDenied:           decoder[EgressDeniedEvent],
	RefusalsSuppressed:     decoder[RefusalsSuppressedEvent],
	BrokerCall:             decoder[BrokerCallEvent],
	BrokerDenied:           decoder[BrokerDeniedEvent],
	WorkspaceCreated:       decoder[WorkspaceCreatedEvent],
	KeyCreated:             decoder[KeyCreatedEvent],
	KeyRevoked:             decoder[KeyRevokedEvent],
	CreditsGranted:         decoder[CreditsGrantedEvent],
	PolicyUpdated:          decoder[PolicyUpdatedEvent],
	SessionCreated:         decoder[SessionCreatedEvent],
	SessionEnded:           decoder[SessionEndedEvent],
	SessionFileTransferred: decoder[SessionFileTransferredEvent],
	SessionPaused:          decoder[SessionPausedEvent],
	SessionResumed:         decoder[SessionResumedEvent],
	SessionSnapshotted:     decoder[SessionSnapshottedEvent],
	SessionForked:          decoder[SessionForkedEvent],
	SnapshotDeleted:        decoder[SnapshotDeletedEvent],
	TemplateBuilt:          decoder[TemplateBuiltEvent],
	TemplateBuildFailed:    decoder[TemplateBuildFailedEvent],
}

// decoder decodes the data of an event of struct T.
func decoder[T Event, P interface {
	*T
	setMetadata(Meta)
}](data []byte, m Meta) (Event, error) {
	var v T
	if len(data) > 0 {
		if err := json.Unmarshal(data, &v); err != nil {
			return nil, err
		}
	}
	P(&v).setMetadata(m)
	return v, nil
}
