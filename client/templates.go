package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/wire"
)

// The template types are the API's, declared in package wire.
type (
	Template         = wire.Template
	TemplateBuild    = wire.TemplateBuild
	SBOM             = wire.SBOM
	DebianPackage    = wire.DebianPackage
	WheelPackage     = wire.WheelPackage
	NPMPackage       = wire.NPMPackage
	TemplateFile     = wire.TemplateFile
	BuildState       = wire.BuildState
	TemplateBuildJob = wire.TemplateBuildJob
	BuildError       = wire.BuildError
	TemplateProgress = wire.TemplateProgress
	BuildRequest     = wire.BuildRequest
)

// The build job states.
const (
	BuildRunning   = wire.BuildRunning
	BuildDone      = wire.BuildDone
	BuildFailed    = wire.BuildFailed
	BuildCancelled = wire.BuildCancelled
)

func templatePath(name string, rest ...string) string {
	p := "/v1/templates/" + url.PathEscape(name)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

// Templates lists the daemon's templates. Admin and approver keys only.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var page Page[Template]
	if _, err := c.do(ctx, http.MethodGet, "/v1/templates", nil, nil, &page); err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	return page.Items, nil
}

// Template returns one template with its current build and SBOM.
func (c *Client) Template(ctx context.Context, name string) (*Template, error) {
	var t Template
	if _, err := c.do(ctx, http.MethodGet, templatePath(name), nil, nil, &t); err != nil {
		return nil, fmt.Errorf("reading template %s: %w", name, err)
	}
	return &t, nil
}

// BuildTemplate starts a build of the template and returns its job,
// running; if one is running already, that one (Joined). Admin keys only.
func (c *Client) BuildTemplate(ctx context.Context, name string, req BuildRequest) (*TemplateBuildJob, error) {
	var j TemplateBuildJob
	if _, err := c.do(ctx, http.MethodPost, templatePath(name, "builds"), nil, req, &j); err != nil {
		return nil, fmt.Errorf("building template %s: %w", name, err)
	}
	return &j, nil
}

// TemplateBuild returns a build job of the template.
func (c *Client) TemplateBuild(ctx context.Context, name, id string) (*TemplateBuildJob, error) {
	var j TemplateBuildJob
	if _, err := c.do(ctx, http.MethodGet, templatePath(name, "builds", id), nil, nil, &j); err != nil {
		return nil, fmt.Errorf("reading build %s of template %s: %w", id, name, err)
	}
	return &j, nil
}

// CancelTemplateBuild cancels a running build job and returns it once it
// has ended; the template's previous build still serves. A job that has
// ended already is returned as it is.
func (c *Client) CancelTemplateBuild(ctx context.Context, name, id string) (*TemplateBuildJob, error) {
	var j TemplateBuildJob
	if _, err := c.do(ctx, http.MethodDelete, templatePath(name, "builds", id), nil, nil, &j); err != nil {
		return nil, fmt.Errorf("cancelling build %s of template %s: %w", id, name, err)
	}
	return &j, nil
}

// BuildEvent is one event of a build job's stream: a progress report
// (Name "progress", Progress set) or the job's end (Name "done", "failed"
// or "cancelled", Job set), the last.
type BuildEvent struct {
	Name     string
	Progress TemplateProgress
	Job      TemplateBuildJob
}

// Final reports whether the event ends the stream.
func (e BuildEvent) Final() bool { return e.Name != "progress" }

// ParseBuildEvent decodes one event of a build job's stream by its name,
// as the API sends it. An unknown name is an error.
func ParseBuildEvent(name string, data []byte) (BuildEvent, error) {
	ev := BuildEvent{Name: name}
	var dst any
	switch name {
	case "progress":
		dst = &ev.Progress
	case "done", "failed", "cancelled":
		dst = &ev.Job
	default:
		return ev, fmt.Errorf("unknown build event %q: %w", name, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(data, dst); err != nil {
		return ev, fmt.Errorf("decoding build event %q: %w", name, err)
	}
	return ev, nil
}

// BuildStream is a build job's events as they happen. Close it when done:
// closing stops watching, it does not stop the build.
type BuildStream struct {
	r     *sseReader
	body  io.Closer
	ctx   context.Context
	ended bool
}

// WatchTemplateBuild returns the events of a build job: progress reports
// while it runs, then its end. A job that has ended answers its end at
// once.
func (c *Client) WatchTemplateBuild(ctx context.Context, name, id string) (*BuildStream, error) {
	hreq, err := c.request(ctx, http.MethodGet, templatePath(name, "builds", id, "events"), nil, nil)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Accept", "text/event-stream")
	resp, err := c.send(hreq)
	if err != nil {
		return nil, fmt.Errorf("watching build %s of template %s: %w", id, name, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		resp.Body.Close()
		return nil, fmt.Errorf("the daemon answered %q (status %d), not an event stream", ct, resp.StatusCode)
	}
	return &BuildStream{r: &sseReader{r: bufio.NewReaderSize(resp.Body, 64<<10)}, body: resp.Body, ctx: ctx}, nil
}

// Next returns the next event. After the final one it returns io.EOF; a
// stream cut before it returns another error (io.ErrUnexpectedEOF when the
// daemon closed it, the context's error when that ended).
func (s *BuildStream) Next() (BuildEvent, error) {
	if s.ended {
		return BuildEvent{}, io.EOF
	}
	name, data, err := s.r.next()
	if err != nil {
		if s.ctx.Err() != nil {
			return BuildEvent{}, s.ctx.Err()
		}
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("the event stream ended before the build did: %w", io.ErrUnexpectedEOF)
		}
		return BuildEvent{}, err
	}
	ev, err := ParseBuildEvent(name, data)
	if err != nil {
		return ev, err
	}
	s.ended = ev.Final()
	return ev, nil
}

// Close releases the stream.
func (s *BuildStream) Close() error { return s.body.Close() }
