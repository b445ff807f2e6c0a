package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/stockade-sh/stockade/blastradius"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/model"
)

func init() {
	commands["audit"] = command{summary: "probe a tool's blast radius; verify the audit log's hash chains", run: auditCmd}
}

const auditUsage = `usage: stockade audit blast-radius --tool NAME [--runtime shell|python|node] [--tools FILE|DIR] [--json]
       stockade audit verify [--workspace NAME] [--db URL]

blast-radius  creates the tool's real sandbox, runs a probe in it that tries
              what hostile code would try, and compares every finding with
              the tool's record; exits 1 if the sandbox reaches anything the
              record does not allow
verify        recomputes the hash chain of every workspace's audit events
              (and of the events no workspace owns); exits 1 at the first
              broken link of any chain
`

func auditCmd(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, auditUsage)
		return exitUsage
	}
	switch args[0] {
	case "blast-radius":
		return auditBlastRadius(ctx, args[1:])
	case "verify":
		return auditVerify(ctx, args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Fprint(os.Stdout, auditUsage)
		return 0
	}
	return fail(usagef("unknown audit command %q; want blast-radius or verify (stockade audit --help)", args[0]))
}

func auditBlastRadius(ctx context.Context, args []string) int {
	fs := newFlags("audit blast-radius", auditUsage)
	cfg, load := configFlags(fs)
	tool := fs.String("tool", "", "tool to audit, e.g. code.execute (required)")
	runtime := fs.String("runtime", "", "runtime image to probe from (default: the first of shell, python, node the tool allows)")
	fs.StringVar(&cfg.Tools, "tools", cfg.Tools, "tools file or directory (default: only the built-in code.execute)")
	fs.StringVar(&cfg.Templates, "templates", cfg.Templates, "templates file or directory, declaring the templates tools name")
	asJSON := fs.Bool("json", false, "print the whole report as JSON")
	pos, err := load(args)
	switch {
	case err != nil:
		return report(flagErr(fs, err), *asJSON)
	case *tool == "":
		return report(usagef("audit blast-radius: --tool is required (the built-in tool is code.execute)"), *asJSON)
	case len(pos) > 0:
		return report(usagef("audit blast-radius takes no arguments, got %q", pos), *asJSON)
	}
	probe, err := guestbin.Probe()
	if err != nil {
		return report(err, *asJSON)
	}
	e, err := wiring.Engine(*cfg)
	if err != nil {
		return report(classifyEngine(err), *asJSON)
	}
	if _, err := e.Tools().Get(*tool); err != nil {
		return report(usageError{err}, *asJSON)
	}
	r, err := blastradius.Run(ctx, e, blastradius.Options{Tool: *tool, Runtime: *runtime, Probe: probe})
	if err != nil {
		return report(classifyEngine(err), *asJSON)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return report(err, *asJSON)
		}
	} else {
		fmt.Print(r.Markdown())
	}
	if len(r.Deviations) > 0 {
		return 1
	}
	return 0
}

func auditVerify(ctx context.Context, args []string) int {
	fs := newFlags("audit verify", auditUsage)
	dbo := dbFlags(fs)
	wsName := fs.String("workspace", "", "verify only this workspace's chain (default: every chain)")
	pos, err := parse(fs, args)
	switch {
	case err != nil:
		return fail(err)
	case len(pos) > 0:
		return fail(usagef("audit verify takes no arguments, got %q", pos))
	}
	st, err := openDB(ctx, dbo)
	if err != nil {
		return fail(err)
	}
	defer st.Close()

	type chain struct{ id, label string }
	var chains []chain
	if *wsName != "" {
		ws, err := st.GetWorkspaceByName(ctx, *wsName)
		if err != nil {
			return fail(classify(err))
		}
		chains = append(chains, chain{ws.ID, fmt.Sprintf("workspace %s (%s)", ws.Name, ws.ID)})
	} else {
		wss, err := st.ListWorkspaces(ctx)
		if err != nil {
			return fail(err)
		}
		for _, ws := range wss {
			chains = append(chains, chain{ws.ID, fmt.Sprintf("workspace %s (%s)", ws.Name, ws.ID)})
		}
		// The events no workspace can be attributed to have a chain of
		// their own.
		chains = append(chains, chain{"", "unattributed events"})
	}
	witnessed, err := st.witness.Chains()
	if err != nil {
		return fail(err)
	}
	if len(witnessed) == 0 {
		where := "no audit witness"
		if st.witness != "" {
			where = fmt.Sprintf("the audit witness %s holds no heads", st.witness)
		}
		fmt.Fprintf(os.Stderr, "stockade: warning: %s (--audit-witness, STOCKADE_AUDIT_WITNESS; the daemon's audit_witness): each chain is checked alone, which cannot show its last events removed\n", where)
	}
	if *wsName == "" {
		// A witnessed chain whose workspace is gone was deleted whole.
		for _, id := range witnessed {
			if !slices.ContainsFunc(chains, func(c chain) bool { return c.id == id }) {
				chains = append(chains, chain{id, fmt.Sprintf("workspace %s", id)})
			}
		}
	}
	broken := 0
	for _, c := range chains {
		line, ok, err := verifyChain(ctx, st, st.witness, c.id)
		if err != nil {
			return fail(fmt.Errorf("verifying the chain of %s: %w", c.label, err))
		}
		if !ok {
			broken++
		}
		fmt.Printf("%s: %s\n", c.label, line)
	}
	if broken > 0 {
		fmt.Fprintf(os.Stderr, "stockade: %d of %d audit chains are broken\n", broken, len(chains))
		return 1
	}
	return 0
}

// verifyChain verifies one chain, against the head witness holds of it if
// any, and describes the verdict in one line.
func verifyChain(ctx context.Context, st chainVerifier, witness witness.Dir, workspaceID string) (string, bool, error) {
	w, witnessed, err := witness.Read(workspaceID)
	if err != nil {
		return "", false, err
	}
	var ws []model.ChainHead
	if witnessed {
		ws = append(ws, w)
		if workspaceID != "" {
			if _, err := st.GetWorkspace(ctx, workspaceID); errdefs.IsNotFound(err) {
				return fmt.Sprintf("BROKEN: the workspace is gone from the database, and its chain with it (witnessed at seq %d)", w.Seq), false, nil
			}
		}
	}
	ok, b, err := st.VerifyChain(ctx, workspaceID, ws...)
	if err != nil {
		return "", false, err
	}
	if !ok {
		if b == nil {
			return "BROKEN (no link reported)", false, nil
		}
		ev := "event " + b.EventID
		if b.EventID == "" {
			ev = "no event"
		}
		return fmt.Sprintf("BROKEN at seq %d (%s): %s", b.Seq, ev, b.Reason), false, nil
	}
	head, err := st.ChainHead(ctx, workspaceID)
	if err != nil {
		return "", false, err
	}
	if head.Seq == 0 {
		return "ok (0 events)", true, nil
	}
	line := fmt.Sprintf("ok (%s, head %s)", plural(int(head.Seq), "event"), head.Hash)
	if witnessed {
		line += fmt.Sprintf(", holds the head witnessed at seq %d", w.Seq)
	}
	return line, true, nil
}
