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
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// Template is a declared template as the API shows it
// (GET /v1/templates/{name}): its declaration, its current build and the
// build job running for it, if any.
type Template struct {
	Name string `json:"name"`
	Base string `json:"base"`
	// Declaration is the template's canonical declaration (JSON), and
	// DeclarationKey its digest ("sha256:...").
	Declaration    json.RawMessage `json:"declaration"`
	DeclarationKey string          `json:"declaration_key"`
	// Source is where the declaration is written ("templates.yaml:3").
	Source string `json:"source,omitempty"`
	// Golden says the template asks for a golden checkpoint.
	Golden bool `json:"golden"`
	// Build is the current build; nil when the template was never built.
	Build *TemplateBuild `json:"build,omitempty"`
	// Stale says the current build is of another declaration than the
	// configured one (or there is none): build it to serve the new one.
	Stale bool `json:"stale"`
	// Job is the build job running for the template, if any; LastJob the
	// last one that ended, while the daemon keeps it: its outcome, and
	// what became of the golden checkpoint.
	Job     *TemplateBuildJob `json:"job,omitempty"`
	LastJob *TemplateBuildJob `json:"last_job,omitempty"`
}

// TemplateBuild is one built image of a template, with its SBOM.
type TemplateBuild struct {
	// Digest is the image's digest ("sha256:...").
	Digest string `json:"digest"`
	// Key is the digest of the declaration and every input (resolved
	// versions, wheel and file hashes, the base image's digest); a build
	// with the same key is a cache hit.
	Key string `json:"key"`
	// Declaration is the digest of the declaration built.
	Declaration string    `json:"declaration"`
	Base        string    `json:"base"`
	Created     time.Time `json:"created"`
	SizeBytes   int64     `json:"size_bytes"`
	SBOM        SBOM      `json:"sbom"`
}

// SBOM is what a template's build installed beyond its base image.
// Packages lists every Debian package of the image with its version.
type SBOM struct {
	// Debian are the Debian packages the template added to its base.
	Debian []DebianPackage `json:"debian"`
	Wheels []WheelPackage  `json:"wheels"`
	NPM    []NPMPackage    `json:"npm"`
	Files  []TemplateFile  `json:"files"`
	// Packages maps every Debian package of the image to its version.
	Packages map[string]string `json:"packages,omitempty"`
}

// DebianPackage is a Debian package and its version.
type DebianPackage struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// WheelPackage is a python wheel installed into a template's image.
type WheelPackage struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}

// NPMPackage is an npm package installed into a template's image, with
// its Subresource Integrity ("sha512-...").
type NPMPackage struct {
	Name      string `json:"name"`
	Version   string `json:"version"`
	Integrity string `json:"integrity"`
}

// TemplateFile is an operator file copied into a template's image.
type TemplateFile struct {
	Target string `json:"target"`
	SHA256 string `json:"sha256"`
}

// BuildState is where a build job is: running, then done, failed or
// cancelled.
type BuildState string

// The build job states.
const (
	BuildRunning   BuildState = "running"
	BuildDone      BuildState = "done"
	BuildFailed    BuildState = "failed"
	BuildCancelled BuildState = "cancelled"
)

// Final reports whether the job has ended.
func (s BuildState) Final() bool { return s != BuildRunning && s != "" }

// TemplateBuildJob is a build of a template run by the daemon
// (POST /v1/templates/{name}/builds).
type TemplateBuildJob struct {
	ID       string     `json:"id"`
	Template string     `json:"template"`
	State    BuildState `json:"state"`
	Pull     bool       `json:"pull"`
	// By is the id of the key that started it.
	By       string           `json:"by"`
	Created  time.Time        `json:"created"`
	Ended    *time.Time       `json:"ended,omitempty"`
	Progress TemplateProgress `json:"progress"`
	// Build is the build made (done); CacheHit says it was built before
	// and no work was done.
	Build    *TemplateBuild `json:"build,omitempty"`
	CacheHit bool           `json:"cache_hit,omitempty"`
	// Golden says what became of the golden checkpoint the template asks
	// for: "made", or why its sandboxes start cold ("cold: ...",
	// "failed: ...", "cancelled"). A job whose build was made is done
	// whatever became of the checkpoint.
	Golden string `json:"golden,omitempty"`
	// Error says why the job failed or was cancelled.
	Error *BuildError `json:"error,omitempty"`
	// Joined, in the answer of a POST, says that a build of the template
	// was running already: the answer is that job, not a new one.
	Joined bool `json:"joined,omitempty"`
}

// BuildError is why a build job failed: the API's stable code and its
// sentence.
type BuildError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// TemplateProgress is how far a build has got: its stage, the packages
// the stage has done of Total (0 while unknown), the image's size so far.
type TemplateProgress struct {
	Stage     string `json:"stage"`
	Packages  int    `json:"packages"`
	Total     int    `json:"total"`
	Bytes     int64  `json:"bytes"`
	ElapsedMS int64  `json:"elapsed_ms"`
}

// BuildRequest is the body of POST /v1/templates/{name}/builds.
type BuildRequest struct {
	// Pull re-resolves the packages even when the declaration was built
	// before (new versions on the mirror or the registry).
	Pull bool `json:"pull"`
}

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
