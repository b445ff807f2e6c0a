package wire

import (
	"encoding/json"
	"time"
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
