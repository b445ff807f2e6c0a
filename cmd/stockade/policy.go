package main

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
)

func init() {
	commands["policy"] = command{summary: "show and set a workspace's policy (on the database directly)", run: policyCmd}
}

func policyCmd(ctx context.Context, args []string) int {
	return dispatch(ctx, "policy", map[string]verb{
		"show": {"print a workspace's policy as JSON", func(ctx context.Context, args []string) int { return policyVerb(ctx, "show", args) }},
		"set":  {"change the fields of a workspace's policy whose flags are given", func(ctx context.Context, args []string) int { return policyVerb(ctx, "set", args) }},
	}, args)
}

const (
	policyShowUsage = "usage: stockade policy show NAME [--db URL]"
	policySetUsage  = `usage: stockade policy set NAME [--approval=required|per_session|none] [--network=allow|deny]
                          [--max-timeout=DURATION] [--runtimes=python,node,shell] [--max-sessions=N]
                          [--code-execution=enabled|disabled] [--tool-changes=flag|require_review]
                          [--fork-approval=anew|inherit]

Flags may come before or after NAME. Only the fields whose flags are given
change; the policy as stored is printed as JSON.`
)

func policyVerb(ctx context.Context, verb string, args []string) int {
	use := map[string]string{"show": policyShowUsage, "set": policySetUsage}[verb]
	fs := newFlags("policy "+verb, use)
	dbo := dbFlags(fs)
	var (
		approval, network, runtimes, codeExec, toolChanges, forkApproval string
		maxTimeout                                                       time.Duration
		maxSessions                                                      int
	)
	if verb == "set" {
		fs.StringVar(&approval, "approval", "", "required, per_session (a session's first cell is approved, which covers its later cells) or none")
		fs.IntVar(&maxSessions, "max-sessions", 0, "most live sessions of the workspace (0: the server's bound, which this never raises)")
		fs.StringVar(&network, "network", "", "allow or deny invocations' network requests (allowed and denied are the same words)")
		durationFlag(fs, &maxTimeout, "max-timeout", 0, "maximum wall clock per invocation, e.g. 30s or 2m (lowers the server's ceiling)")
		fs.StringVar(&runtimes, "runtimes", "", "comma-separated allowed runtimes")
		fs.StringVar(&codeExec, "code-execution", "", "enabled or disabled")
		fs.StringVar(&toolChanges, "tool-changes", "", "flag or require_review")
		fs.StringVar(&forkApproval, "fork-approval", "", "anew (a fork's first cell is approved anew under per_session) or inherit (a fork is covered by its source's approval)")
	}
	pos, err := parse(fs, args)
	if err != nil {
		return fail(err)
	}
	if len(pos) != 1 {
		return fail(usagef("policy %s takes one workspace NAME, got %d arguments (stockade policy %s --help)", verb, len(pos), verb))
	}
	name := pos[0]
	st, ws, err := openWorkspace(ctx, dbo, name)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	pol, err := st.GetPolicy(ctx, ws.ID)
	if err != nil {
		return fail(err)
	}
	if verb == "set" {
		before := audit.PolicyOf(pol)
		if err := applyPolicyFlags(fs, &pol, policyFlags{approval: approval, network: network,
			maxTimeout: maxTimeout, runtimes: runtimes, codeExec: codeExec, toolChanges: toolChanges, forkApproval: forkApproval,
			maxSessions: maxSessions}); err != nil {
			return fail(err)
		}
		if pol, err = st.SetPolicy(ctx, ws.ID, pol, func(after model.Policy) []model.NewEvent {
			return audit.NewEvents(audit.PolicyUpdatedEvent{Meta: cliMeta("workspace policy changed"), Before: before, After: audit.PolicyOf(after)})
		}); err != nil {
			return fail(classify(err))
		}
		st.witnessChain(ctx, ws.ID)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(api.PolicyOf(pol)); err != nil {
		return fail(err)
	}
	return 0
}

// policyFlags are the values of policy set's flags.
type policyFlags struct {
	approval, network, runtimes, codeExec, toolChanges, forkApproval string
	maxTimeout                                                       time.Duration
	maxSessions                                                      int
}

// applyPolicyFlags changes the fields of p whose flags were given.
func applyPolicyFlags(fs *flag.FlagSet, p *model.Policy, v policyFlags) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if err != nil {
			return
		}
		switch f.Name {
		case "approval":
			switch v.approval {
			case "required", "none", "per_session":
				p.Approval = model.ApprovalMode(v.approval)
			default:
				err = usagef("--approval must be required, per_session or none, got %q", v.approval)
			}
		case "max-sessions":
			if v.maxSessions < 0 {
				err = usagef("--max-sessions must be 0 or more, got %d", v.maxSessions)
			}
			p.MaxSessions = v.maxSessions
		case "network":
			allow, perr := policy.ParseNetwork(v.network)
			if perr != nil || v.network == "" {
				err = usagef("--network must be allow or deny, got %q", v.network)
				return
			}
			p.NetworkAllowed = allow
		case "max-timeout":
			if v.maxTimeout <= 0 {
				err = usagef("--max-timeout must be more than 0, got %s", sandbox.FormatDuration(v.maxTimeout))
			}
			p.MaxTimeout = v.maxTimeout
		case "runtimes":
			p.Runtimes = nil
			for _, r := range strings.Split(v.runtimes, ",") {
				if r = strings.TrimSpace(r); r == "" {
					continue
				}
				if _, ok := image.Runtimes[r]; !ok {
					err = usagef("--runtimes: unknown runtime %q (known: python, node, shell)", r)
					return
				}
				p.Runtimes = append(p.Runtimes, r)
			}
		case "code-execution":
			switch v.codeExec {
			case "enabled", "disabled":
				p.CodeExecution = v.codeExec == "enabled"
			default:
				err = usagef("--code-execution must be enabled or disabled, got %q", v.codeExec)
			}
		case "tool-changes":
			switch v.toolChanges {
			case "flag", "require_review":
				p.ToolChanges = model.ToolChangeMode(v.toolChanges)
			default:
				err = usagef("--tool-changes must be flag or require_review, got %q", v.toolChanges)
			}
		case "fork-approval":
			switch v.forkApproval {
			case "anew", "inherit":
				p.ForkApproval = model.ForkApprovalMode(v.forkApproval)
			default:
				err = usagef("--fork-approval must be anew or inherit, got %q", v.forkApproval)
			}
		}
	})
	return err
}
