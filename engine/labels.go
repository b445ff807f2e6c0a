package engine

// Labels the capability layer puts on every sandbox it starts, so that a
// restarted daemon can find the orphans of a crashed one and the
// observers can tell which execution an egress decision concerns.
const (
	LabelOwner     = "stockade.owner"
	LabelExecution = "stockade.execution"
)
