package audit

import "encoding/json"

// Changes of the tools' records. Registered, changed and removed are in
// the unattributed chain (workspace ""), since tools are configuration of
// the whole daemon; a change is also copied into every workspace's chain.
// A review approval is in the chain of the workspace that approved.
const (
	ToolRegistered         = "tool.registered"
	ToolRegisteredCode     = "TOL001I"
	ToolChanged            = "tool.changed"
	ToolChangedCode        = "TOL002W"
	ToolRemoved            = "tool.removed"
	ToolRemovedCode        = "TOL003I"
	ToolReviewApproved     = "tool.review_approved"
	ToolReviewApprovedCode = "TOL004I"
)

// ToolRegisteredEvent is a tool record loaded for the first time, or again
// after it was removed.
type ToolRegisteredEvent struct {
	Meta        `json:"-"`
	Tool        string `json:"tool"`
	Fingerprint string `json:"fingerprint"`
	// Record is the record in its canonical JSON (tools.Canonical).
	Record json.RawMessage `json:"record,omitempty"`
}

func (ToolRegisteredEvent) Type() string { return ToolRegistered }
func (ToolRegisteredEvent) Code() string { return ToolRegisteredCode }

// ToolChangedEvent is a tool record that differs from the one the audit
// trail saw last.
type ToolChangedEvent struct {
	Meta                `json:"-"`
	Tool                string          `json:"tool"`
	Fingerprint         string          `json:"fingerprint"`
	PreviousFingerprint string          `json:"previous_fingerprint,omitempty"`
	Record              json.RawMessage `json:"record,omitempty"`
	// Diff lists the fields that changed, one line each.
	Diff []string `json:"diff,omitempty"`
	// Growth lists what the tool reaches now that it did not before
	// (egress allowlist, credentials).
	Growth []string `json:"growth,omitempty"`
	// ReviewRequired flags a change that grew the tool's reach (or one
	// after such a change not reviewed yet): workspaces that require
	// review refuse the tool until an approver re-approves it.
	ReviewRequired bool `json:"review_required,omitempty"`
	// Template is the change of the declaration of the tool's template
	// (package templates), when it changed; Diff and Growth list it too,
	// as template.* fields. Nil when the template did not change.
	Template *TemplateChange `json:"template,omitempty"`
	// Source, in a workspace's copy, is the event of the unattributed
	// chain it copies.
	Source *EventRef `json:"source,omitempty"`
}

// TemplateChange is what changed in a tool's template declaration
// (templates.Change): entries added and removed, as they are written (a
// wheel with its SHA-256, a file as "source -> target"), and the names of
// the other fields that changed.
type TemplateChange struct {
	// Name is the template's name now; PreviousName its name before when
	// the tool changed templates. Empty for none.
	Name         string `json:"name,omitempty"`
	PreviousName string `json:"previous_name,omitempty"`

	DebianAdded   []string `json:"debian_added,omitempty"`
	DebianRemoved []string `json:"debian_removed,omitempty"`
	NPMAdded      []string `json:"npm_added,omitempty"`
	NPMRemoved    []string `json:"npm_removed,omitempty"`
	WheelsAdded   []string `json:"wheels_added,omitempty"`
	WheelsRemoved []string `json:"wheels_removed,omitempty"`
	FilesAdded    []string `json:"files_added,omitempty"`
	FilesRemoved  []string `json:"files_removed,omitempty"`
	Other         []string `json:"other,omitempty"`
	// Grows says that packages, wheels or files were added, or npm
	// install scripts turned on: the change requires review.
	Grows bool `json:"grows,omitempty"`
}

func (ToolChangedEvent) Type() string { return ToolChanged }
func (ToolChangedEvent) Code() string { return ToolChangedCode }

// EventRef names an event of another chain by its place and hash.
type EventRef struct {
	Seq  int64  `json:"seq"`
	Hash string `json:"hash"`
}

// ToolRemovedEvent is a tool no longer configured; Fingerprint is its last
// record's.
type ToolRemovedEvent struct {
	Meta        `json:"-"`
	Tool        string `json:"tool"`
	Fingerprint string `json:"fingerprint"`
}

func (ToolRemovedEvent) Type() string { return ToolRemoved }
func (ToolRemovedEvent) Code() string { return ToolRemovedCode }

// ToolReviewApprovedEvent is a workspace's approver re-approving a changed
// tool as its record is now (Fingerprint).
type ToolReviewApprovedEvent struct {
	Meta        `json:"-"`
	Tool        string `json:"tool"`
	Fingerprint string `json:"fingerprint"`
}

func (ToolReviewApprovedEvent) Type() string { return ToolReviewApproved }
func (ToolReviewApprovedEvent) Code() string { return ToolReviewApprovedCode }
