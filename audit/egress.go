package audit

// What a running sandbox did through the egress proxy and the credential
// broker, in the chain of its execution's workspace.
const (
	// EgressDenied is a connection or DNS question of a sandbox that the
	// egress proxy refused; Reason is the proxy's stable reason.
	EgressDenied     = "egress.denied"
	EgressDeniedCode = "EGR001W"
	// RefusalsSuppressed counts the refusals of an execution (egress
	// proxy and broker) past the ones audited one by one.
	RefusalsSuppressed     = "egress.refusals_suppressed"
	RefusalsSuppressedCode = "EGR002W"
	BrokerCall             = "broker.call"
	BrokerCallCode         = "BRK001I"
	BrokerDenied           = "broker.denied"
	BrokerDeniedCode       = "BRK002W"
)

// EgressDeniedEvent is a refusal of the egress proxy.
type EgressDeniedEvent struct {
	Meta `json:"-"`
	// Addr is the address refused, empty when none was involved.
	Addr   string `json:"addr,omitempty"`
	Detail string `json:"detail"`
	// Name is the destination name as the sandbox sent it (bounded).
	Name     string `json:"name"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol"`
	Sandbox  string `json:"sandbox"`
	Tool     string `json:"tool"`
}

func (EgressDeniedEvent) Type() string { return EgressDenied }
func (EgressDeniedEvent) Code() string { return EgressDeniedCode }

// RefusalsSuppressedEvent is written when an execution ends that made more
// refusals than are audited one by one.
type RefusalsSuppressedEvent struct {
	Meta `json:"-"`
	// Audited is how many were audited one by one, Suppressed how many
	// more were only counted.
	Audited    int `json:"audited"`
	Suppressed int `json:"suppressed"`
}

func (RefusalsSuppressedEvent) Type() string { return RefusalsSuppressed }
func (RefusalsSuppressedEvent) Code() string { return RefusalsSuppressedCode }

// BrokerCallEvent is a call of the credential broker that it made: the
// operation, the hash of its parameters (never the parameters or the
// secret) and the upstream's status.
type BrokerCallEvent struct {
	Meta         `json:"-"`
	Operation    string `json:"operation"`
	ParamsSHA256 string `json:"params_sha256"`
	Sandbox      string `json:"sandbox"`
	// Status is the upstream's HTTP status; 0 when no upstream call was
	// made or it failed.
	Status int    `json:"status"`
	Tool   string `json:"tool"`
}

func (BrokerCallEvent) Type() string { return BrokerCall }
func (BrokerCallEvent) Code() string { return BrokerCallCode }

// BrokerDeniedEvent is a call the broker refused; Reason says why. Its data
// is a call's: a BrokerCallEvent converts to it.
type BrokerDeniedEvent BrokerCallEvent

func (BrokerDeniedEvent) Type() string { return BrokerDenied }
func (BrokerDeniedEvent) Code() string { return BrokerDeniedCode }
