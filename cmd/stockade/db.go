package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// dbOptions are the flags that name an admin command's database.
type dbOptions struct {
	fs                   *flag.FlagSet
	db, dataDir, witness *string
}

// dbFlags registers --db, --data-dir and --audit-witness for the admin
// commands, which work on the database directly (the daemon need not run).
func dbFlags(fs *flag.FlagSet) dbOptions {
	return dbOptions{
		fs:      fs,
		dataDir: fs.String("data-dir", config.Default().DataDir, "data directory holding the default database (env STOCKADE_DATA_DIR)"),
		db:      fs.String("db", "", "database URL: sqlite:PATH or postgres://... (default sqlite in the data directory; env STOCKADE_DB)"),
		witness: fs.String("audit-witness", "", "directory witnessing the audit chains' heads, as the daemon's audit_witness (env STOCKADE_AUDIT_WITNESS; default next to a SQLite file, none for PostgreSQL)"),
	}
}

// openDB opens the database the flags name. The caller must Close it.
func openDB(ctx context.Context, o dbOptions) (*adminDB, error) {
	db, dataDir, w := *o.db, *o.dataDir, *o.witness
	flagOrEnv(o.fs, "data-dir", "STOCKADE_DATA_DIR", &dataDir)
	flagOrEnv(o.fs, "db", "STOCKADE_DB", &db)
	flagOrEnv(o.fs, "audit-witness", "STOCKADE_AUDIT_WITNESS", &w)
	if db == "" {
		if err := os.MkdirAll(dataDir, fsmode.Traverse); err != nil {
			return nil, err
		}
		fixDataDir(dataDir, w)
		db = storeopen.DefaultURL(dataDir)
	}
	st, err := storeopen.Open(ctx, db)
	if err != nil {
		return nil, classify(err)
	}
	w = cmp.Or(w, witness.Default(db))
	return &adminDB{adminStore: st, witness: witness.Dir(w)}, nil
}

// openWorkspace opens the database the flags name and finds the workspace
// name in it (an unknown name is bad input). The caller must Close the
// database.
func openWorkspace(ctx context.Context, o dbOptions, name string) (*adminDB, model.Workspace, error) {
	st, err := openDB(ctx, o)
	if err != nil {
		return nil, model.Workspace{}, err
	}
	ws, err := st.GetWorkspaceByName(ctx, name)
	if err != nil {
		st.Close()
		return nil, model.Workspace{}, classify(err)
	}
	return st, ws, nil
}

// adminStore is the database an admin command opens: the whole store,
// since the admin commands are where the CLI administers it (workspaces,
// keys, policies, credits, each change audited in its own transaction,
// and the audit chains' verification).
type adminStore = store.Store

// chainVerifier is what audit verify reads of a chain.
type chainVerifier interface {
	GetWorkspace(ctx context.Context, id string) (model.Workspace, error)
	ChainHead(ctx context.Context, workspaceID string) (model.ChainHead, error)
	VerifyChain(ctx context.Context, workspaceID string, witnessed ...model.ChainHead) (bool, *model.BrokenLink, error)
}

// adminDB is a database opened by an admin command, with the directory
// that witnesses its audit chains.
type adminDB struct {
	adminStore
	witness witness.Dir
}

// witnessChain records the head of a workspace's chain after the command
// changed it, so that a later truncation of the chain shows. A failure,
// and a chain that does not link to its witnessed head, only warn: the
// change is made.
func (a *adminDB) witnessChain(ctx context.Context, workspaceID string) {
	if err := a.witness.Record(ctx, a.adminStore, workspaceID); err != nil {
		fmt.Fprintf(os.Stderr, "stockade: warning: %v\n", err)
	}
}

// cliMeta is the metadata of the audit event of a change made from the CLI,
// which the store appends in the change's own transaction (its workspace is
// the change's).
func cliMeta(reason string) audit.Meta { return audit.Meta{Actor: "cli", Reason: reason} }
