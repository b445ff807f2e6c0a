package audit

// Builds of templates' images (README, "Templates"), each in the chain of
// the workspace whose admin key asked for it (actor: the key's id). A
// declaration change is a tool record change, audited as tool.changed; a
// build says what its image holds and how it differs from the build it
// replaced.
const (
	TemplateBuilt           = "template.built"
	TemplateBuiltCode       = "TPL001I"
	TemplateBuildFailed     = "template.build_failed"
	TemplateBuildFailedCode = "TPL002W"
)

// TemplateSBOM counts what a template's image holds beyond its base.
type TemplateSBOM struct {
	// Debian is the Debian packages the template added to its base.
	Debian int `json:"debian"`
	Wheels int `json:"wheels"`
	NPM    int `json:"npm"`
	Files  int `json:"files"`
}

// TemplateBuiltEvent is a template's image built (or found built: CacheHit)
// and made its current build.
type TemplateBuiltEvent struct {
	Meta     `json:"-"`
	Template string `json:"template"`
	// Digest is the image's digest; PreviousDigest the build it replaced,
	// empty for the first.
	Digest         string `json:"digest"`
	PreviousDigest string `json:"previous_digest,omitempty"`
	// Key is the digest of the declaration and every input; Declaration
	// the declaration's alone (templates.Key).
	Key         string `json:"key"`
	Declaration string `json:"declaration,omitempty"`
	// CacheHit says the declaration and inputs were built before: no work
	// was done. Pull says the build re-resolved the packages.
	CacheHit bool         `json:"cache_hit,omitempty"`
	Pull     bool         `json:"pull,omitempty"`
	SBOM     TemplateSBOM `json:"sbom"`
	// Added and Removed list what differs from the previous build: Debian
	// packages, wheels and npm packages as "name version", files as their
	// target.
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	// Golden says what became of a golden checkpoint the template asks
	// for: "made", or why the template starts cold.
	Golden string `json:"golden,omitempty"`
	// Job is the build job's id.
	Job string `json:"job"`
}

func (TemplateBuiltEvent) Type() string { return TemplateBuilt }
func (TemplateBuiltEvent) Code() string { return TemplateBuiltCode }

// TemplateBuildFailedEvent is a build that failed or was cancelled; the
// template's previous build, if any, still serves.
type TemplateBuildFailedEvent struct {
	Meta        `json:"-"`
	Template    string `json:"template"`
	Declaration string `json:"declaration,omitempty"`
	Pull        bool   `json:"pull,omitempty"`
	// Stage is the stage the build was in.
	Stage string `json:"stage,omitempty"`
	// Error is what went wrong; Cancelled says a key cancelled it.
	Error     string `json:"error"`
	Cancelled bool   `json:"cancelled,omitempty"`
	Job       string `json:"job"`
}

func (TemplateBuildFailedEvent) Type() string { return TemplateBuildFailed }
func (TemplateBuildFailedEvent) Code() string { return TemplateBuildFailedCode }
