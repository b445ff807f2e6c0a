package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
)

// maxText bounds the short text fields (names, types, actors, ids).
const maxText = 256

// maxReason bounds free-form reasons and notes.
const maxReason = 4096

// checkText refuses what one of the two databases would store differently or
// not at all: invalid UTF-8 and NUL bytes (PostgreSQL's text rejects both).
func checkText(field, v string, max int) error {
	if len(v) > max {
		return errdefs.Publicf("%s is longer than %d bytes: %w", field, max, errdefs.ErrInvalidArgument)
	}
	if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
		return errdefs.Publicf("%s is not valid UTF-8 text: %w", field, errdefs.ErrInvalidArgument)
	}
	return nil
}

// lookupRow is QueryRow for a row found by a key the caller gave (an id
// from a URL, a name from the command line): a key that is not valid text
// cannot name a row, and finds none on both databases alike (PostgreSQL
// would refuse the query).
func lookupRow(ctx context.Context, q Querier, key, query string, args ...any) Row {
	if checkText("key", key, maxText) != nil {
		return noRow{}
	}
	return q.QueryRow(ctx, query, args...)
}

// noRow is a Row that found nothing.
type noRow struct{}

func (noRow) Scan(...any) error { return sql.ErrNoRows }

func checkRequired(field, v string, max int) error {
	if strings.TrimSpace(v) == "" {
		return errdefs.Publicf("%s is required: %w", field, errdefs.ErrInvalidArgument)
	}
	return checkText(field, v, max)
}

// checkJSON accepts empty (stored as NULL) or one valid UTF-8 JSON value.
func checkJSON(field string, v json.RawMessage) error {
	if len(v) == 0 {
		return nil
	}
	if !utf8.Valid(v) || !json.Valid(v) {
		return errdefs.Publicf("%s is not valid JSON: %w", field, errdefs.ErrInvalidArgument)
	}
	return nil
}

func checkSHA256Hex(field, v string) error {
	if len(v) != 64 {
		return errdefs.Publicf("%s must be 64 lower-case hex digits: %w", field, errdefs.ErrInvalidArgument)
	}
	for _, c := range v {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return errdefs.Publicf("%s must be 64 lower-case hex digits: %w", field, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func checkEvent(e model.NewEvent) error {
	if err := checkRequired("event type", e.Type, maxText); err != nil {
		return err
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"event workspace", e.WorkspaceID, maxText},
		{"event code", e.Code, maxText},
		{"event actor", e.Actor, maxText},
		{"event execution id", e.ExecutionID, maxText},
		{"event reason", e.Reason, maxReason},
	} {
		if err := checkText(f.name, f.v, f.max); err != nil {
			return err
		}
	}
	return checkJSON("event data", e.Data)
}

func checkEvents(es []model.NewEvent) error {
	for _, e := range es {
		if err := checkEvent(e); err != nil {
			return err
		}
	}
	return nil
}
