// Package witness keeps, outside the database, the last head of each audit
// chain seen (store.ChainHead): one small file per chain in a directory of
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

	"github.com/stockade-sh/stockade/store"
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

// Record witnesses h unless the directory already holds a head of its
// chain at least as far along. A head never goes back: the chain only
// grows.
func (d Dir) Record(h store.ChainHead) error {
	if d == "" || h.Seq == 0 {
		return nil
	}
	if strings.ContainsAny(h.WorkspaceID, "/\x00") || h.WorkspaceID == unattributed || h.WorkspaceID == "." || h.WorkspaceID == ".." {
		return fmt.Errorf("witnessing the chain of %q: not a workspace id", h.WorkspaceID)
	}
	if old, ok, err := d.Read(h.WorkspaceID); err != nil || (ok && old.Seq >= h.Seq) {
		return err
	}
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
func (d Dir) Read(workspaceID string) (h store.ChainHead, ok bool, err error) {
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
	return store.ChainHead{WorkspaceID: workspaceID, Seq: n, Hash: hash}, true, nil
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

// RecordAll witnesses the current head of every chain of st.
func (d Dir) RecordAll(ctx context.Context, st store.Store) error {
	if d == "" {
		return nil
	}
	wss, err := st.ListWorkspaces(ctx)
	if err != nil {
		return err
	}
	ids := []string{""}
	for _, ws := range wss {
		ids = append(ids, ws.ID)
	}
	var errs []error
	for _, id := range ids {
		h, err := st.ChainHead(ctx, id)
		if err == nil {
			err = d.Record(h)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
