package engine

// Labels the capability layer puts on every sandbox it starts, so that a
// restarted daemon can find the orphans of a crashed one and the
// observers can tell which execution an egress decision concerns.
const (
	LabelOwner     = "stockade.owner"
	LabelExecution = "stockade.execution"
)

// LabelSession names the session whose sandbox it is, and LabelWorkspace
// and LabelTool its workspace and tool: a session's sandbox carries them
// besides LabelOwner.
const (
	LabelSession   = "stockade.session"
	LabelWorkspace = "stockade.workspace"
	LabelTool      = "stockade.tool"
)
