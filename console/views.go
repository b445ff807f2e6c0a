package console

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// keyLabel names a key for people: its label and role, or its id; "system"
// and "cli" (actors that are not keys) as they are.
func (c *Console) keyLabel(ctx context.Context, v *visit, id string) string {
	if !strings.HasPrefix(id, "key_") {
		return id
	}
	if l, ok := v.labels[id]; ok {
		return l
	}
	l := id
	if k, err := c.st.GetAPIKey(ctx, id); err == nil && k.WorkspaceID == v.key.WorkspaceID {
		if k.Name != "" {
			l = fmt.Sprintf("%s (%s, %s)", k.Name, k.Role, id)
		} else {
			l = fmt.Sprintf("%s (%s)", id, k.Role)
		}
	}
	v.labels[id] = l
	return l
}

// recordLine is one of a tool's five lines, split into text and the parts
// the record quotes (shown as code).
type recordLine struct {
	Label string
	Parts []recordPart
}

type recordPart struct {
	Text string
	Code bool
}

func recordLines(t tools.Tool, opts tools.Options) []recordLine {
	var out []recordLine
	for _, l := range tools.RecordLines(t, opts) {
		rl := recordLine{Label: l.Label}
		for i, s := range strings.Split(l.Value, "`") {
			if s != "" {
				rl.Parts = append(rl.Parts, recordPart{Text: s, Code: i%2 == 1})
			}
		}
		out = append(out, rl)
	}
	return out
}

// cardView is an approval request as its card shows it.
type cardView struct {
	ID, ExecutionID string
	Status          model.ApprovalStatus
	Card            capability.ApprovalCard
	Code            Code
	Stdin           *Code
	// Record is the tool's five lines now; ToolChanged says the record
	// changed since the request was made (approving it is refused).
	Record      []recordLine
	ToolChanged bool
	Boundary    string
	RequestedBy string
	RequestedAt time.Time
	ExpiresAt   time.Time
	DecidedBy   string
	DecidedAt   time.Time
	Reason      string
	Exec        *execView
	// Flash is what went wrong with a decision just tried.
	Flash string
	CSRF  string
	// Now is the time of rendering, for the expiry.
	Now time.Time
}

// Pending reports whether the request waits for a decision.
func (cv *cardView) Pending() bool { return cv.Status == model.ApprovalPending }

// Lines is the number of lines of the code.
func (cv *cardView) Lines() int { return len(cv.Code.Lines) }

// Hidden is the number of invisible characters in the code and stdin.
func (cv *cardView) Hidden() int {
	n := cv.Code.Hidden
	if cv.Stdin != nil {
		n += cv.Stdin.Hidden
	}
	return n
}

// Network describes what the request asks of the network.
func (cv *cardView) Network() string {
	if cv.Card.Network != "allow" {
		return "none (no network interface but loopback)"
	}
	ports := make([]string, len(cv.Card.EgressPorts))
	for i, p := range cv.Card.EgressPorts {
		ports[i] = strconv.Itoa(p)
	}
	return fmt.Sprintf("requested: %s on port %s, through the egress proxy", strings.Join(cv.Card.EgressAllow, ", "), strings.Join(ports, ", "))
}

func (c *Console) cardView(ctx context.Context, v *visit, a model.Approval) (*cardView, error) {
	cv := &cardView{ID: a.ID, ExecutionID: a.ExecutionID, Status: a.Status, RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt,
		DecidedAt: a.DecidedAt, Reason: a.Reason, CSRF: v.sess.csrf, Now: c.opts.Now()}
	if err := json.Unmarshal(a.Card, &cv.Card); err != nil {
		return nil, fmt.Errorf("reading the card of approval %s: %w: %w", a.ID, err, errInternal)
	}
	cv.Code = Highlight(cv.Card.Runtime, cv.Card.Code)
	if cv.Card.Stdin != "" {
		s := Highlight("", cv.Card.Stdin)
		cv.Stdin = &s
	}
	if t, err := c.svc.Runner().Tools().Get(cv.Card.Tool); err == nil {
		opts := c.toolOptions()
		cv.Record, cv.Boundary = recordLines(t, opts), tools.Boundary(t, opts)
		cv.ToolChanged = cv.Card.ToolFingerprint != "" && tools.Fingerprint(t) != cv.Card.ToolFingerprint
	} else {
		cv.ToolChanged = true
	}
	cv.RequestedBy = c.keyLabel(ctx, v, cv.Card.RequestedBy)
	if a.DecidedBy != "" {
		cv.DecidedBy = c.keyLabel(ctx, v, a.DecidedBy)
	}
	if a.Status == model.ApprovalApproved {
		e, err := c.execView(ctx, v, a.ExecutionID)
		if err != nil {
			return nil, err
		}
		cv.Exec = e
	}
	return cv, nil
}

// execView is an execution as the lists and cards show it: its tool_calls
// row, with previews of its output.
type execView struct {
	ID       string
	Status   model.ExecutionStatus
	Runtime  string
	Tool     string
	ExitCode *int
	Stdout   Code
	Stderr   Code
	// StdoutCut and StderrCut say the preview is not the whole output.
	StdoutCut, StderrCut bool
	HasStdout, HasStderr bool
	Created              time.Time
	Started, Finished    time.Time
	Credits              int64
	Driver               string
}

// Live reports whether the execution has not ended yet.
func (e *execView) Live() bool { return !e.Status.Terminal() }

// Queued is how long the execution waited to start (or to end, when it
// never started); zero while it waits.
func (e *execView) Queued() time.Duration {
	switch {
	case !e.Started.IsZero():
		return e.Started.Sub(e.Created)
	case !e.Finished.IsZero():
		return e.Finished.Sub(e.Created)
	}
	return 0
}

// Ran is how long the code ran; zero when it did not start.
func (e *execView) Ran() time.Duration {
	if e.Started.IsZero() || e.Finished.IsZero() {
		return 0
	}
	return e.Finished.Sub(e.Started)
}

// Preview is the first line of the output, for a list.
func (e *execView) Preview() string {
	s := joinCode(e.Stdout)
	if s == "" {
		s = joinCode(e.Stderr)
	}
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 120 {
		cut := 120
		for cut > 0 && s[cut]&0xC0 == 0x80 {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// joinCode is the text of c with its hidden characters named.
func joinCode(c Code) string {
	var b strings.Builder
	for i, l := range c.Lines {
		if i > 0 {
			b.WriteByte('\n')
		}
		for _, t := range l {
			if t.Ctl() {
				b.WriteString(t.Label())
			} else {
				b.WriteString(t.Text)
			}
		}
	}
	return b.String()
}

func execViewOf(tc model.ToolCall) *execView {
	return &execView{ID: tc.ExecutionID, Status: tc.Status, Runtime: tc.Runtime, Tool: tc.Tool, ExitCode: tc.ExitCode,
		Stdout: Highlight("", string(tc.StdoutPreview)), Stderr: Highlight("", string(tc.StderrPreview)),
		StdoutCut: tc.StdoutTruncated || len(tc.StdoutPreview) >= model.PreviewLimit, StderrCut: tc.StderrTruncated || len(tc.StderrPreview) >= model.PreviewLimit,
		HasStdout: len(tc.StdoutPreview) > 0, HasStderr: len(tc.StderrPreview) > 0,
		Created: tc.CreatedAt, Started: tc.StartedAt, Finished: tc.FinishedAt, Credits: tc.CreditsCharged, Driver: tc.Driver}
}

func (c *Console) execView(ctx context.Context, v *visit, id string) (*execView, error) {
	tc, err := c.st.GetToolCall(ctx, v.key.WorkspaceID, id)
	if err != nil {
		return nil, fmt.Errorf("reading execution %s: %w", id, err)
	}
	return execViewOf(tc), nil
}

// resultView is an execution's result document, as the API answers it
// (wire.Result): a one-shot's or a cell's. Error is why Stockade could not
// run it, or the exception a cell raised.
type resultView struct {
	*wire.Result
	Error  string
	Stdout Code
	Stderr Code
}

func resultOf(raw json.RawMessage) (*resultView, error) {
	r, err := wire.ResultOf(raw)
	if err != nil {
		return nil, fmt.Errorf("reading a result document: %w: %w", err, errInternal)
	}
	if r == nil {
		return nil, nil
	}
	v := &resultView{Result: r, Error: r.Error, Stdout: Highlight("", r.Stdout), Stderr: Highlight("", r.Stderr)}
	if r.Raised != nil {
		v.Error = r.Raised.Name + ": " + r.Raised.Value
	}
	return v, nil
}

// funcs are the templates' helpers.
func (c *Console) funcs() template.FuncMap {
	return template.FuncMap{
		"when": func(t time.Time) string {
			if t.IsZero() {
				return "—"
			}
			return t.UTC().Format("2006-01-02 15:04:05 UTC")
		},
		"iso": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"dur": func(d time.Duration) string {
			switch {
			case d <= 0:
				return "—"
			case d < time.Second:
				return fmt.Sprintf("%d ms", d.Milliseconds())
			case d < time.Minute:
				return fmt.Sprintf("%.1f s", d.Seconds())
			}
			return d.Round(time.Second).String()
		},
		"until": func(t, now time.Time) string {
			d := t.Sub(now).Round(time.Second)
			if d <= 0 {
				return "now"
			}
			return "in " + d.String()
		},
		"ms": func(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() },
		"exit": func(p *int) string {
			if p == nil {
				return "—"
			}
			return strconv.Itoa(*p)
		},
		"plural": func(n int, one, many string) string {
			if n == 1 {
				return "1 " + one
			}
			return strconv.Itoa(n) + " " + many
		},
		"statuses": func() []model.ExecutionStatus { return model.ExecutionStatuses },
		"more":     func(i, n int) bool { return i+1 < n },
	}
}

// notFoundIsGone turns a record of another workspace, or none, into the
// page's not-found answer.
func notFoundIsGone(err error, what string) error {
	if errdefs.IsNotFound(err) {
		return errdefs.Publicf("there is no %s of that id in this workspace: %w", what, errdefs.ErrNotFound)
	}
	return err
}

// toolOptions are what the records of the engine's tools are read with:
// the capabilities its drivers declare.
func (c *Console) toolOptions() tools.Options {
	return tools.Options{Drivers: tools.CapabilitiesOf(c.svc.Runner().Drivers())}
}
