package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

func init() {
	commands["key"] = command{summary: "create, list and revoke API keys (on the database directly)", run: keyCmd}
}

func keyCmd(ctx context.Context, args []string) int {
	return dispatch(ctx, "key", map[string]verb{
		"create": {"create a key; prints the key on stdout (shown once) and its id on stderr", keyCreate},
		"list":   {"list a workspace's keys: id, role, label, created, last used, revoked", keyList},
		"revoke": {"revoke a key by its id", keyRevoke},
	}, args)
}

const keyCreateUsage = `usage: stockade key create --workspace NAME --role agent|approver|admin [--name LABEL]

Prints the key alone on stdout, so that AGENT=$(stockade key create ...)
captures it, and its id (which the audit trail and key list name) on
stderr. The key is shown this once: the database keeps only its hash.`

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
	case !model.Role(*role).Valid():
		return fail(usagef("key create: --role must be agent, approver or admin, got %q", *role))
	}
	st, ws, err := openWorkspace(ctx, dbo, *wsName)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fail(err)
	}
	key := "sk_" + base64.RawURLEncoding.EncodeToString(b[:])
	k, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: model.Role(*role), Hash: model.HashKey(key), Name: *name,
		Audit: func(k model.APIKey) []model.NewEvent {
			return audit.NewEvents(audit.KeyCreatedEvent{Meta: cliMeta("API key created"), KeyID: k.ID, Role: k.Role})
		}})
	if err != nil {
		return fail(classify(err))
	}
	st.witnessChain(ctx, ws.ID)
	fmt.Println(key)
	fmt.Fprintf(os.Stderr, "created %s key %s in workspace %s (stockade key revoke %s revokes it)\n", k.Role, k.ID, ws.Name, k.ID)
	return 0
}

func keyList(ctx context.Context, args []string) int {
	fs := newFlags("key list", "usage: stockade key list --workspace NAME\n\nLists the workspace's keys, oldest first, revoked ones included; never the\nkeys themselves, which the database does not hold. LAST USED is recorded\nby the daemon within a few seconds of a use.")
	dbo := dbFlags(fs)
	wsName := fs.String("workspace", "", "workspace name (required)")
	pos, err := parse(fs, args)
	switch {
	case err != nil:
		return fail(err)
	case len(pos) > 0:
		return fail(usagef("key list takes no arguments, got %q (stockade key list --help)", pos))
	case *wsName == "":
		return fail(usagef("key list: --workspace is required"))
	}
	st, ws, err := openWorkspace(ctx, dbo, *wsName)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	keys, err := st.ListAPIKeys(ctx, ws.ID)
	if err != nil {
		return fail(err)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tROLE\tLABEL\tCREATED\tLAST USED\tREVOKED")
	for _, k := range keys {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Role, orDash(k.Name), stamp(k.CreatedAt), stamp(k.LastUsedAt), stamp(k.RevokedAt))
	}
	if err := w.Flush(); err != nil {
		return fail(err)
	}
	return 0
}

func keyRevoke(ctx context.Context, args []string) int {
	fs := newFlags("key revoke", "usage: stockade key revoke ID\n\nRevokes the key with the id that key create and key list print; the daemon\nrefuses it from then on. The revocation is an audit event of the key's\nworkspace. Revoking a revoked key changes nothing.")
	dbo := dbFlags(fs)
	pos, err := parse(fs, args)
	switch {
	case err != nil:
		return fail(err)
	case len(pos) != 1:
		return fail(usagef("key revoke takes one key ID, got %d arguments (stockade key list --workspace NAME shows them)", len(pos)))
	}
	st, err := openDB(ctx, dbo)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	k, err := st.GetAPIKey(ctx, pos[0])
	if err != nil {
		return fail(classify(err))
	}
	if !k.RevokedAt.IsZero() {
		fmt.Printf("key %s was already revoked at %s\n", k.ID, stamp(k.RevokedAt))
		return 0
	}
	if err := st.RevokeAPIKey(ctx, k.WorkspaceID, k.ID, func(k model.APIKey) []model.NewEvent {
		return audit.NewEvents(audit.KeyRevokedEvent{Meta: cliMeta("API key revoked"), KeyID: k.ID, Role: k.Role})
	}); err != nil {
		return fail(classify(err))
	}
	st.witnessChain(ctx, k.WorkspaceID)
	fmt.Printf("revoked key %s\n", k.ID)
	return 0
}

// stamp prints a stored time in UTC to the second, "-" for none.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
