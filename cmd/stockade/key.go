package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/store"
)

func init() {
	commands["key"] = command{summary: "create API keys (on the database directly)", run: keyCmd}
}

func keyCmd(ctx context.Context, args []string) int {
	if len(args) == 0 || args[0] != "create" {
		return fail(usagef("usage: stockade key create --workspace NAME --role agent|approver|admin [--name LABEL]"))
	}
	fs := flag.NewFlagSet("key create", flag.ContinueOnError)
	dbo := dbFlags(fs)
	wsName := fs.String("workspace", "", "workspace name (required)")
	role := fs.String("role", "", "agent (may invoke), approver (may decide approvals) or admin (both)")
	name := fs.String("name", "", "a label for people")
	pos, err := parseArgs(fs, args[1:])
	if err != nil {
		return exitUsage
	}
	if *wsName == "" || !store.Role(*role).Valid() || len(pos) > 0 {
		return fail(usagef("usage: stockade key create --workspace NAME --role agent|approver|admin"))
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
	_, err = st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: store.Role(*role), Hash: store.HashKey(key), Name: *name,
		Audit: func(k store.APIKey) []store.NewEvent {
			return cliEvents(audit.KeyCreated, audit.KeyCreatedCode, "API key created", map[string]string{"key_id": k.ID, "role": *role})
		}})
	if err != nil {
		return fail(classify(err))
	}
	st.witnessChain(ctx, ws.ID)
	// The key alone on stdout, so that `KEY=$(stockade key create ...)` works;
	// it is shown once and stored only as a hash.
	fmt.Println(key)
	return 0
}
