package api

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/wire"
)

// pageOf reads ?limit= and ?cursor=.
func pageOf(r *http.Request) (store.PageRequest, error) {
	q := r.URL.Query()
	pr := store.PageRequest{Cursor: q.Get("cursor")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > store.MaxPageLimit {
			return pr, errdefs.Publicf("limit=%q: expected 1 to %d: %w", v, store.MaxPageLimit, errdefs.ErrInvalidArgument)
		}
		pr.Limit = n
	}
	return pr, nil
}

// timeRange reads ?since= and ?until= (RFC 3339).
func timeRange(r *http.Request) (since, until time.Time, err error) {
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"since", &since}, {"until", &until}} {
		if v := r.URL.Query().Get(f.name); v != "" {
			t, perr := time.Parse(time.RFC3339Nano, v)
			if perr != nil {
				return since, until, errdefs.Publicf("%s=%q: expected an RFC 3339 time: %w", f.name, v, errdefs.ErrInvalidArgument)
			}
			*f.dst = t
		}
	}
	return since, until, nil
}

// pageInTime reads the paging and time-range parameters together.
func pageInTime(r *http.Request) (store.PageRequest, time.Time, time.Time, error) {
	pr, err := pageOf(r)
	if err != nil {
		return pr, time.Time{}, time.Time{}, err
	}
	since, until, err := timeRange(r)
	return pr, since, until, err
}

func (s *server) listApprovals(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	pr, err := pageOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f := store.ApprovalFilter{PageRequest: pr}
	if v := r.URL.Query().Get("status"); v != "" {
		st := model.ApprovalStatus(v)
		switch st {
		case model.ApprovalPending, model.ApprovalApproved, model.ApprovalDenied, model.ApprovalExpired, model.ApprovalCancelled:
		default:
			s.writeError(w, r, errdefs.Publicf("status=%q: expected pending, approved, denied, expired or cancelled: %w", v, errdefs.ErrInvalidArgument))
			return
		}
		f.Statuses = []model.ApprovalStatus{st}
	}
	page, err := s.st.ListApprovals(r.Context(), p.WorkspaceID, f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := wire.Page[wire.Approval]{Items: []wire.Approval{}, Next: page.Next}
	for _, a := range page.Items {
		out.Items = append(out.Items, approvalView(a))
	}
	writeJSON(w, http.StatusOK, out)
}

// maxListValues bounds a comma-separated filter: each value becomes a
// query parameter, and SQLite and PostgreSQL cap those at different counts.
const maxListValues = 32

// listParam returns the distinct values of the comma-separated query
// parameter name (none when it is absent), at most maxListValues.
func listParam(r *http.Request, name string) ([]string, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return nil, nil
	}
	var out []string
	for _, x := range strings.Split(v, ",") {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
		if len(out) > maxListValues {
			return nil, errdefs.Publicf("%s: at most %d values: %w", name, maxListValues, errdefs.ErrInvalidArgument)
		}
	}
	return out, nil
}

func (s *server) listEvents(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	pr, since, until, err := pageInTime(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f := store.EventFilter{PageRequest: pr, Since: since, Until: until, ExecutionID: r.URL.Query().Get("execution_id")}
	if f.Types, err = listParam(r, "type"); err != nil {
		s.writeError(w, r, err)
		return
	}
	page, err := s.st.ListEvents(r.Context(), p.WorkspaceID, f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := wire.Page[wire.AuditEvent]{Items: []wire.AuditEvent{}, Next: page.Next}
	for _, e := range page.Items {
		out.Items = append(out.Items, eventView(e))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) listToolCalls(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	pr, since, until, err := pageInTime(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f := store.ToolCallFilter{PageRequest: pr, Since: since, Until: until}
	statuses, err := listParam(r, "status")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	for _, st := range statuses {
		if !model.ExecutionStatus(st).Valid() {
			s.writeError(w, r, errdefs.Publicf("status: unknown status %q: %w", st, errdefs.ErrInvalidArgument))
			return
		}
		f.Statuses = append(f.Statuses, model.ExecutionStatus(st))
	}
	page, err := s.st.ListToolCalls(r.Context(), p.WorkspaceID, f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := wire.Page[wire.ToolCall]{Items: []wire.ToolCall{}, Next: page.Next}
	for _, c := range page.Items {
		out.Items = append(out.Items, toolCallView(c))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) getWorkspace(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	st := s.st
	ws, err := st.GetWorkspace(r.Context(), p.WorkspaceID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	pol, err := st.GetPolicy(r.Context(), p.WorkspaceID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	cr, err := st.GetCredits(r.Context(), p.WorkspaceID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	v := wire.Workspace{ID: ws.ID, Name: ws.Name, Policy: PolicyOf(pol), Credits: wire.Credits{Available: cr.Available, Reserved: cr.Reserved}}
	if v.Sessions.CheckpointBytes, v.Sessions.Paused, err = st.CheckpointBytes(r.Context(), p.WorkspaceID); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	drivers := map[string]string{}
	healthy := true
	for name, err := range s.svc.Health(r.Context()) {
		if err != nil {
			drivers[name] = sentence(err.Error())
			if name == s.svc.Runner().DefaultDriver() {
				healthy = false
			}
		} else {
			drivers[name] = "ok"
		}
	}
	code, statusText := http.StatusOK, "ok"
	if !healthy {
		code, statusText = http.StatusServiceUnavailable, "degraded"
	}
	writeJSON(w, code, wire.Health{Status: statusText, DefaultDriver: s.svc.Runner().DefaultDriver(), Drivers: drivers})
}

func (s *server) listTools(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ts, err := s.svc.Tools(r.Context(), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := wire.Page[wire.Tool]{Items: []wire.Tool{}}
	for _, t := range ts {
		out.Items = append(out.Items, toolView(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) approveTool(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var body wire.DecisionRequest
	if r.ContentLength != 0 {
		if err := s.decodeBody(w, r, &body); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	ts, err := s.svc.ApproveTool(r.Context(), p, r.PathValue("name"), body.Reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toolView(ts))
}
