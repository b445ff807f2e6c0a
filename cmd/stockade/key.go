package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/store"
)

func init() {
	commands["key"] = command{summary: "create API keys (on the database directly)", run: keyCmd}
}

func keyCmd(ctx context.Context, args []string) int {
	return dispatch(ctx, "key", map[string]verb{
		"create": {"create a key; prints the key on stdout (shown once) and its id on stderr", keyCreate},
	}, args)
}

const keyCreateUsage = `usage: stockade key create --workspace NAME --role agent|approver|admin [--name LABEL]

Prints the key alone on stdout, so that AGENT=$(stockade key create ...)
captures it, and its id (which the audit trail names) on stderr. The key is shown this once: the database keeps only its hash.`

func keyCreate(ctx context.Context, args []string) int {
	fs := newFlags("key create", keyCreateUsage)
	dbo := dbFlags(fs)
	wsName := fs.String("workspace", "", "workspace name (required)")
	role := fs.String("role", "", "agent (may invoke), approver (may decide approvals) or admin (both)")
	name := fs.String("name", "", "a label for people")
	pos, err := parse(fs, args)
	switch {
	case err != nil:
		return fail(err)
	case len(pos) > 0:
		return fail(usagef("key create takes no arguments, got %q (stockade key create --help)", pos))
	case *wsName == "":
		return fail(usagef("key create: --workspace is required"))
	case !store.Role(*role).Valid():
		return fail(usagef("key create: --role must be agent, approver or admin, got %q", *role))
	}
	st, err := openDB(ctx, dbo)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	ws, err := st.GetWorkspaceByName(ctx, *wsName)
	if err != nil {
		return fail(classify(err))
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fail(err)
	}
	key := "sk_" + base64.RawURLEncoding.EncodeToString(b[:])
	k, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: store.Role(*role), Hash: store.HashKey(key), Name: *name,
		Audit: func(k store.APIKey) []store.NewEvent {
			return cliEvents(audit.KeyCreated, audit.KeyCreatedCode, "API key created", map[string]string{"key_id": k.ID, "role": *role})
		}})
	if err != nil {
		return fail(classify(err))
	}
	st.witnessChain(ctx, ws.ID)
	fmt.Println(key)
	fmt.Fprintf(os.Stderr, "created %s key %s in workspace %s\n", k.Role, k.ID, ws.Name)
	return 0
}
