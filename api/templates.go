package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/templatejobs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/wire"
)

// TemplateService is what the API serves templates and their builds from
// (*templatejobs.Jobs).
type TemplateService interface {
	Templates() ([]templatejobs.Status, error)
	Template(name string) (templatejobs.Status, error)
	Start(name string, pull bool, by templatejobs.Requester) (j templatejobs.Job, joined bool, err error)
	Get(name, id string) (templatejobs.Job, error)
	Cancel(ctx context.Context, name, id, by string) (templatejobs.Job, error)
	Watch(name, id string) (*templatejobs.Watch, error)
}

// templateRoutes are the endpoints of templates: reading them takes an
// admin or approver key (approvers review what a template adds), building
// them an admin key.
func (s *server) templateRoutes() []route {
	return []route{
		{"GET /v1/templates", s.auth(s.listTemplates)},
		{"GET /v1/templates/{name}", s.auth(s.getTemplate)},
		{"POST /v1/templates/{name}/builds", s.auth(s.buildTemplate)},
		{"GET /v1/templates/{name}/builds/{id}", s.auth(s.getTemplateBuild)},
		{"DELETE /v1/templates/{name}/builds/{id}", s.auth(s.cancelTemplateBuild)},
		{"GET /v1/templates/{name}/builds/{id}/events", s.auth(s.templateBuildEvents)},
	}
}

// templates returns the service, or why templates cannot be served.
func (s *server) templates(p capability.Principal, build bool) (TemplateService, error) {
	switch {
	case build && p.Role != model.RoleAdmin:
		return nil, errdefs.Publicf("only admin keys may build templates: %w", errdefs.ErrPermissionDenied)
	case p.Role != model.RoleAdmin && p.Role != model.RoleApprover:
		return nil, errdefs.Publicf("only admin and approver keys may read templates: %w", errdefs.ErrPermissionDenied)
	case s.opts.Templates == nil:
		return nil, errdefs.Publicf("this daemon serves no templates: %w", errdefs.ErrNotFound)
	}
	return s.opts.Templates, nil
}

// templateView is the wire form of a template and its builds.
func (s *server) templateView(st templatejobs.Status) wire.Template {
	decl, key := templatejobs.Declaration(st.Template)
	v := wire.Template{Name: st.Template.Name, Base: st.Template.Base, Declaration: decl, DeclarationKey: key,
		Source: st.Template.Source, Golden: st.Template.Golden, Build: st.Build, Stale: st.Stale()}
	if st.Running != nil {
		j := s.jobView(*st.Running)
		v.Job = &j
	}
	if st.Last != nil {
		j := s.jobView(*st.Last)
		v.LastJob = &j
	}
	return v
}

// jobView is the wire form of a build job. The error of a failed job is
// answered as any error is (Public); the job logged its cause when it
// ended (templatejobs.Options.Describe), not at each answer.
func (s *server) jobView(j templatejobs.Job) wire.TemplateBuildJob {
	v := wire.TemplateBuildJob{ID: j.ID, Template: j.Template, State: j.State, Pull: j.Pull, By: j.By.KeyID, Created: j.Created,
		Progress: progressView(j), Build: j.Build, CacheHit: j.CacheHit, Golden: j.Golden}
	if !j.Ended.IsZero() {
		v.Ended = &j.Ended
	}
	var c *templatejobs.Cancelled
	switch {
	case j.Err == nil:
	case errors.As(j.Err, &c):
		v.Error = &wire.BuildError{Code: "cancelled", Message: c.Error()}
	default:
		_, d, _ := Public(j.Err)
		v.Error = &wire.BuildError{Code: d.Code, Message: d.Message}
	}
	return v
}

func progressView(j templatejobs.Job) wire.TemplateProgress {
	p := j.Progress
	return wire.TemplateProgress{Stage: p.Stage, Packages: p.Packages, Total: p.Total, Bytes: p.Bytes, ElapsedMS: p.Elapsed.Milliseconds()}
}

func (s *server) listTemplates(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	list, err := s.templateList(p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.Page[wire.Template]{Items: list})
}

// templateList is the templates p may read, as GET /v1/templates and
// MCP's list_templates list them: none when the daemon serves none.
func (s *server) templateList(p capability.Principal) ([]wire.Template, error) {
	ts, err := s.templates(p, false)
	if errdefs.IsNotFound(err) {
		return []wire.Template{}, nil
	}
	if err != nil {
		return nil, err
	}
	list, err := ts.Templates()
	if err != nil {
		return nil, err
	}
	out := []wire.Template{}
	for _, st := range list {
		out = append(out, s.templateView(st))
	}
	return out, nil
}

func (s *server) getTemplate(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ts, err := s.templates(p, false)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := ts.Template(r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.templateView(st))
}

// buildTemplate starts a build: 202 with the job, running. While a build
// of the template runs, a second request starts none: it is answered 202
// with the running job, "joined": true, whose pull is the first request's.
func (s *server) buildTemplate(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ts, err := s.templates(p, true)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req wire.BuildRequest
	if r.ContentLength != 0 {
		if err := s.decodeBody(w, r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	j, joined, err := ts.Start(r.PathValue("name"), req.Pull, templatejobs.Requester{KeyID: p.KeyID, WorkspaceID: p.WorkspaceID})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	v := s.jobView(j)
	v.Joined = joined
	w.Header().Set("Location", "/v1/templates/"+j.Template+"/builds/"+j.ID)
	writeJSON(w, http.StatusAccepted, v)
}

func (s *server) getTemplateBuild(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ts, err := s.templates(p, true)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	j, err := ts.Get(r.PathValue("name"), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.jobView(j))
}

// cancelTemplateBuild cancels a running build and answers the job once it
// has ended: cancelled, the template's previous build still serving; or
// done or failed if it ended first. A job cancelled while it makes the
// golden checkpoint has made its build, the template's current one: it
// is done, its golden "cancelled", and the template starts cold.
func (s *server) cancelTemplateBuild(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ts, err := s.templates(p, true)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.MaxWait)
	defer cancel()
	j, err := ts.Cancel(ctx, r.PathValue("name"), r.PathValue("id"), p.KeyID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.jobView(j))
}

// templateBuildEvents streams a build job as Server-Sent Events: a
// progress event at each change of its progress, then one of done,
// failed or cancelled with the job (its error, when it has one, in the
// API's error shape), the last. A job that has ended answers only that.
func (s *server) templateBuildEvents(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ts, err := s.templates(p, true)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.writeError(w, r, errdefs.Publicf("streaming is not supported by this connection: %w", errdefs.ErrInvalidArgument))
		return
	}
	watch, err := ts.Watch(r.PathValue("name"), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer watch.Close()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	keep := time.NewTicker(s.opts.KeepAlive)
	defer keep.Stop()
	sent := -1
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keep.C:
			fmt.Fprint(w, ": keep-alive\n\n")
		case <-watch.C:
			j := watch.Job()
			if j.State.Final() {
				writeEvent(w, string(j.State), s.jobView(j))
				flusher.Flush()
				return
			}
			if j.Seq == sent || j.Seq == 0 {
				continue // no progress yet, or none since the last
			}
			sent = j.Seq
			writeEvent(w, "progress", progressView(j))
		}
		flusher.Flush()
	}
}

// writeEvent writes one Server-Sent Event with v as its JSON data.
func writeEvent(w http.ResponseWriter, name string, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
}
