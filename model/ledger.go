package model

import "time"

// Credits is a workspace's balance. Available can be reserved; Reserved is
// held by open reservations. Both are never negative.
type Credits struct {
	Available int64
	Reserved  int64
}

// ReservationStatus is the state of a reservation. Open moves to committed
// or released exactly once.
type ReservationStatus string

// The reservation states.
const (
	ReservationOpen      ReservationStatus = "open"
	ReservationCommitted ReservationStatus = "committed"
	ReservationReleased  ReservationStatus = "released"
)

// Reservation holds credits for one execution. SettledAt is zero while open.
type Reservation struct {
	ID          string
	WorkspaceID string
	ExecutionID string
	Amount      int64
	Status      ReservationStatus
	CreatedAt   time.Time
	SettledAt   time.Time
}

// LedgerKind is the kind of a credit movement.
type LedgerKind string

// The ledger kinds. Grant adds to Available; reserve moves Available to
// Reserved; commit removes from Reserved; release moves Reserved back.
const (
	LedgerGrant   LedgerKind = "grant"
	LedgerReserve LedgerKind = "reserve"
	LedgerCommit  LedgerKind = "commit"
	LedgerRelease LedgerKind = "release"
)

// LedgerEntry is one credit movement. Amount is always positive; Kind gives
// its direction. ReservationID and ExecutionID are empty for grants.
type LedgerEntry struct {
	ID            string
	WorkspaceID   string
	Kind          LedgerKind
	Amount        int64
	ReservationID string
	ExecutionID   string
	Note          string
	CreatedAt     time.Time
}
