// Package analytics ships the tool_invocations rows that the store enqueues
// in its analytics outbox (store.AnalyticsOutbox) to an analytics database,
// ClickHouse, in batches. A row is shipped at least once: the shipper
// deletes a batch's entries only after the sink has stored the batch, so a
// crash in between sends the batch again, and the sink keeps one row per
// invocation id (ClickHouse: a ReplacingMergeTree keyed by it), so that a
// retry never counts twice. The outbox is bounded: past Options.MaxRows
// rows or Options.MaxAge, the oldest entries are dropped, logged and
// counted; this is the one place where rows are lost, by configuration.
//
// Only the daemon ships, while it holds the database's daemon claim:
//
//	sink, err := analytics.NewClickHouse(analytics.ClickHouseConfig{URL: "http://127.0.0.1:8123"})
//	if err != nil { ... }
//	sh := analytics.NewShipper(st, sink, analytics.Options{Observer: metrics, Logger: log})
//	go sh.Run(ctx) // until ctx ends
//
// Invocations never wait for the shipper: it only reads and deletes outbox
// entries, in transactions of its own.
package analytics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// Outbox is what the shipper needs of the store (store.AnalyticsOutbox).
type Outbox interface {
	ListOutbox(ctx context.Context, limit int) ([]store.OutboxEntry, error)
	DeleteOutbox(ctx context.Context, invocationIDs []string) (int64, error)
	TrimOutbox(ctx context.Context, maxRows int64, before time.Time) (int64, error)
	OutboxStats(ctx context.Context) (store.OutboxStats, error)
}

// Sink is where the rows go.
type Sink interface {
	// Prepare creates what Insert needs (a database, a table) if missing.
	Prepare(ctx context.Context) error
	// Insert stores rows, all or none. Rows it already has (the same
	// invocation id) must not count twice. ErrNotFound means what Prepare
	// creates is gone.
	Insert(ctx context.Context, rows []model.ToolInvocation) error
}

// Observer is told what the shipper does, for metrics.
type Observer interface {
	// AnalyticsShipped counts rows the sink stored.
	AnalyticsShipped(rows int)
	// AnalyticsDropped counts rows dropped from the outbox past its bound.
	AnalyticsDropped(rows int64)
	// AnalyticsFailed counts a round that failed, for one of Reasons.
	AnalyticsFailed(reason string)
	// AnalyticsBacklog reports the rows in the outbox and the age of the
	// oldest (zero when empty), after every round.
	AnalyticsBacklog(rows int64, lag time.Duration)
}

// The reasons a round fails (Observer.AnalyticsFailed).
const (
	// FailUnavailable: the sink is unreachable, times out or fails.
	FailUnavailable = "unavailable"
	// FailPermissionDenied: the sink refused the credentials.
	FailPermissionDenied = "permission_denied"
	// FailRejected: the sink refused a statement or the rows.
	FailRejected = "rejected"
	// FailStore: the outbox could not be read or updated.
	FailStore = "store"
)

// Reasons lists every reason a round fails.
var Reasons = []string{FailUnavailable, FailPermissionDenied, FailRejected, FailStore}

// Options configure a Shipper. Zero fields take the configuration's
// defaults (package config).
type Options struct {
	// BatchSize is the most rows sent at once, at most
	// store.MaxOutboxBatch; zero means config.DefaultAnalyticsBatchSize.
	BatchSize int
	// Interval is the pause between rounds; zero means
	// config.DefaultAnalyticsInterval.
	Interval time.Duration
	// MaxRows bounds the rows waiting in the outbox; zero means
	// config.DefaultOutboxMaxRows.
	MaxRows int64
	// MaxAge bounds how long a row waits; zero means
	// config.DefaultOutboxMaxAge.
	MaxAge time.Duration
	// Observer receives metrics; nil means none.
	Observer Observer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// failureLogEvery is how often a failure that goes on is logged again.
const failureLogEvery = 5 * time.Minute

// Shipper moves rows from an Outbox to a Sink. It is not safe for
// concurrent use: one Run, or one Ship at a time.
type Shipper struct {
	ob   Outbox
	sink Sink
	o    Options
	log  *slog.Logger

	prepared bool
	// failing is the last round's error, empty after a round that
	// succeeded; failLogged is when it was last logged.
	failing    string
	failLogged time.Time
}

// NewShipper returns a shipper from ob to sink.
func NewShipper(ob Outbox, sink Sink, o Options) *Shipper {
	if o.BatchSize <= 0 {
		o.BatchSize = config.DefaultAnalyticsBatchSize
	}
	o.BatchSize = min(o.BatchSize, store.MaxOutboxBatch)
	if o.Interval <= 0 {
		o.Interval = config.DefaultAnalyticsInterval
	}
	if o.MaxRows <= 0 {
		o.MaxRows = config.DefaultOutboxMaxRows
	}
	if o.MaxAge <= 0 {
		o.MaxAge = config.DefaultOutboxMaxAge
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Shipper{ob: ob, sink: sink, o: o, log: o.Logger}
}

// Run ships a round at once and then every Interval, until ctx ends.
func (s *Shipper) Run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_ = s.Ship(ctx)
		t.Reset(s.o.Interval)
	}
}

// Ship runs one round: it drops what is past the outbox's bound, then
// sends batches, oldest first, until the outbox is empty or a batch fails,
// and reports the backlog. A failure is logged (when it is new, and every
// few minutes while it lasts) and counted, and returned; the rows stay in
// the outbox for the next round.
func (s *Shipper) Ship(ctx context.Context) error {
	reason, err := s.ship(ctx)
	if err != nil && ctx.Err() == nil {
		s.o.Observer.AnalyticsFailed(reason)
		if now := s.o.Now(); err.Error() != s.failing || now.Sub(s.failLogged) >= failureLogEvery {
			s.log.Error("analytics: shipping tool_invocations rows failed; they wait in the outbox",
				"sink", fmt.Sprint(s.sink), "reason", reason, "err", err)
			s.failing, s.failLogged = err.Error(), now
		}
	} else if err == nil && s.failing != "" {
		s.log.Info("analytics: shipping tool_invocations rows resumed", "sink", fmt.Sprint(s.sink))
		s.failing = ""
	}
	if st, serr := s.ob.OutboxStats(ctx); serr == nil {
		var lag time.Duration
		if st.Rows > 0 {
			lag = max(s.o.Now().Sub(st.Oldest), 0)
		}
		s.o.Observer.AnalyticsBacklog(st.Rows, lag)
	} else if ctx.Err() == nil {
		s.log.Warn("analytics: counting the outbox", "err", serr)
	}
	return err
}

func (s *Shipper) ship(ctx context.Context) (reason string, err error) {
	dropped, err := s.ob.TrimOutbox(ctx, s.o.MaxRows, s.o.Now().Add(-s.o.MaxAge))
	if err != nil {
		return FailStore, err
	}
	if dropped > 0 {
		s.o.Observer.AnalyticsDropped(dropped)
		s.log.Warn("analytics: the outbox is past its bound; dropped its oldest rows, which will not be shipped",
			"dropped", dropped, "max_rows", s.o.MaxRows, "max_age", s.o.MaxAge.String())
	}
	if !s.prepared {
		if err := s.sink.Prepare(ctx); err != nil {
			return sinkReason(err), err
		}
		s.prepared = true
	}
	for {
		entries, err := s.ob.ListOutbox(ctx, s.o.BatchSize)
		if err != nil {
			return FailStore, err
		}
		if len(entries) == 0 {
			return "", nil
		}
		rows := make([]model.ToolInvocation, len(entries))
		ids := make([]string, len(entries))
		for i, e := range entries {
			rows[i], ids[i] = e.Invocation, e.Invocation.ID
		}
		if err := s.sink.Insert(ctx, rows); err != nil {
			if errdefs.IsNotFound(err) {
				// The table was dropped under us: create it again next round.
				s.prepared = false
			}
			return sinkReason(err), err
		}
		s.o.Observer.AnalyticsShipped(len(rows))
		// The batch is stored: its entries go even if ctx just ended, so
		// that a daemon stopping sends it again only if it stops hard.
		delCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_, err = s.ob.DeleteOutbox(delCtx, ids)
		cancel()
		if err != nil {
			return FailStore, fmt.Errorf("deleting %d shipped outbox entries (they will be sent again): %w", len(ids), err)
		}
		if len(entries) < s.o.BatchSize || ctx.Err() != nil {
			return "", ctx.Err()
		}
	}
}

// sinkReason classifies a sink's error.
func sinkReason(err error) string {
	switch {
	case errdefs.IsPermissionDenied(err):
		return FailPermissionDenied
	case errdefs.IsUnavailable(err), errors.Is(err, context.DeadlineExceeded):
		return FailUnavailable
	}
	return FailRejected
}

type nopObserver struct{}

func (nopObserver) AnalyticsShipped(int)                  {}
func (nopObserver) AnalyticsDropped(int64)                {}
func (nopObserver) AnalyticsFailed(string)                {}
func (nopObserver) AnalyticsBacklog(int64, time.Duration) {}
