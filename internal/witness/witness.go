// Package witness keeps, outside the database, the last head of each audit
// chain seen (model.ChainHead): one small file per chain in a directory of
// its own. A chain checked against its witness (store.Audit.VerifyChain)
// shows what the chain alone cannot, an attacker with the database who
// removes the last events and rewinds the recorded head, or rewrites the
// chain from some event on. The witness is as good as the directory is out
// of that attacker's reach: next to a SQLite file it guards against a SQL
// writer only; for PostgreSQL the operator names a directory on the
// daemon's host (audit_witness).
package witness

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
)

// unattributed names the file of the chain of events no workspace owns.
const unattributed = "unattributed"

// Default is the witness directory of the database at url when none is
// configured: next to a SQLite file, none for PostgreSQL (whose witness
// belongs on another machine than the database, which only the operator
// knows).
func Default(url string) string {
	if path, ok := strings.CutPrefix(url, "sqlite:"); ok {
		return path + ".witness"
	}
	return ""
}

// Dir is a witness directory; "" witnesses nothing.
type Dir string

func (d Dir) file(workspaceID string) string {
	if workspaceID == "" {
		workspaceID = unattributed
	}
	return filepath.Join(string(d), workspaceID)
}

// Chains is what a witness needs of a store: the chains there are, and
// the walk from a witnessed head to the recorded one.
type Chains interface {
	ListWorkspaces(ctx context.Context) ([]model.Workspace, error)
	VerifyChainFrom(ctx context.Context, from model.ChainHead) (model.ChainHead, *model.BrokenLink, error)
}

// NotLinkedError is Record's refusal to witness a chain's head: the chain
// does not link it to the head the directory already holds, which it
// keeps. A chain rewritten from some event on and padded past the
// witnessed head, however consistent its hashes, is refused so, and
// `stockade audit verify` reports the break against the head kept.
type NotLinkedError struct {
	// Witnessed is the head the directory holds and keeps; its Seq is
	// zero when the chain was never witnessed (the whole chain was walked).
	Witnessed model.ChainHead
	// Broken is the first link from Witnessed on that does not hold.
	Broken model.BrokenLink
}

func (e *NotLinkedError) Error() string {
	if e.Witnessed.Seq == 0 {
		return fmt.Sprintf("refusing to witness the audit chain of %q: it is broken at seq %d (%s); run stockade audit verify",
			e.Witnessed.WorkspaceID, e.Broken.Seq, e.Broken.Reason)
	}
	return fmt.Sprintf("refusing to witness the audit chain of %q past seq %d: the chain no longer links to the head witnessed there, at seq %d: %s; "+
		"the witness keeps seq %d; the database may have been tampered with: run stockade audit verify",
		e.Witnessed.WorkspaceID, e.Witnessed.Seq, e.Broken.Seq, e.Broken.Reason, e.Witnessed.Seq)
}

// Unwrap classes the refusal: the chain is not in a state to be witnessed.
func (e *NotLinkedError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// Record witnesses the current head of the chain of workspaceID ("" for
// the unattributed events), provided the chain links it to the head the
// directory already holds: the event at the witnessed seq is still the
// one witnessed, and every event after it links to it, up to the head.
// Otherwise it returns a *NotLinkedError and keeps the old witness. Only
// the events from the witnessed seq on are read, so that witnessing every
// few seconds costs the events since the last witness, not the whole
// chain; a chain never witnessed is walked whole, once. A head never goes
// back: the chain only grows.
func (d Dir) Record(ctx context.Context, st Chains, workspaceID string) error {
	if d == "" {
		return nil
	}
	if strings.ContainsAny(workspaceID, "/\x00") || workspaceID == unattributed || workspaceID == "." || workspaceID == ".." {
		return fmt.Errorf("witnessing the chain of %q: not a workspace id: %w", workspaceID, errdefs.ErrInvalidArgument)
	}
	old, _, err := d.Read(workspaceID)
	if err != nil {
		return err
	}
	old.WorkspaceID = workspaceID
	h, broken, err := st.VerifyChainFrom(ctx, old)
	if err != nil {
		return fmt.Errorf("witnessing the audit chain of %q: %w", workspaceID, err)
	}
	if broken != nil {
		return &NotLinkedError{Witnessed: old, Broken: *broken}
	}
	if h.Seq <= old.Seq {
		return nil
	}
	return d.write(h)
}

// write records h as the witnessed head of its chain, atomically.
func (d Dir) write(h model.ChainHead) error {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return fmt.Errorf("witnessing the audit chain: %w", err)
	}
	f, err := os.CreateTemp(string(d), ".tmp-")
	if err != nil {
		return fmt.Errorf("witnessing the audit chain: %w", err)
	}
	_, err = fmt.Fprintf(f, "%d %s\n", h.Seq, h.Hash)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), d.file(h.WorkspaceID))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("witnessing the audit chain of %q: %w", h.WorkspaceID, err)
	}
	return nil
}

// Read returns the witnessed head of a workspace's chain ("" for the
// unattributed events); ok is false when none is witnessed.
func (d Dir) Read(workspaceID string) (h model.ChainHead, ok bool, err error) {
	if d == "" {
		return h, false, nil
	}
	b, err := os.ReadFile(d.file(workspaceID))
	if errors.Is(err, fs.ErrNotExist) {
		return h, false, nil
	}
	if err != nil {
		return h, false, fmt.Errorf("reading the witness of %q: %w", workspaceID, err)
	}
	seq, hash, found := strings.Cut(strings.TrimSpace(string(b)), " ")
	n, perr := strconv.ParseInt(seq, 10, 64)
	if !found || perr != nil || n <= 0 || len(hash) != 64 {
		return h, false, fmt.Errorf("the witness %s is unreadable: %q", d.file(workspaceID), b)
	}
	return model.ChainHead{WorkspaceID: workspaceID, Seq: n, Hash: hash}, true, nil
}

// Chains lists the workspaces whose chains are witnessed ("" for the
// unattributed events), so that a verifier notices a witnessed workspace
// that is gone from the database.
func (d Dir) Chains() ([]string, error) {
	if d == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(string(d))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing witnesses: %w", err)
	}
	var out []string
	for _, e := range entries {
		switch name := e.Name(); {
		case strings.HasPrefix(name, "."):
		case name == unattributed:
			out = append(out, "")
		default:
			out = append(out, name)
		}
	}
	return out, nil
}

// RecordAll witnesses the current head of every chain of st (Record).
// It returns the chains it refused to witness apart from err, the
// failures that kept it from checking a chain at all.
func (d Dir) RecordAll(ctx context.Context, st Chains) (refused []*NotLinkedError, err error) {
	if d == "" {
		return nil, nil
	}
	wss, err := st.ListWorkspaces(ctx)
	if err != nil {
		return nil, err
	}
	ids := []string{""}
	for _, ws := range wss {
		ids = append(ids, ws.ID)
	}
	var errs []error
	for _, id := range ids {
		var nl *NotLinkedError
		switch err := d.Record(ctx, st, id); {
		case errors.As(err, &nl):
			refused = append(refused, nl)
		case err != nil:
			errs = append(errs, err)
		}
	}
	return refused, errors.Join(errs...)
}
