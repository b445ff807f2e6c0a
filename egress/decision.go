package egress

import (
	"net/netip"
	"time"
)

// Protocol is how a connection reached the proxy.
type Protocol string

const (
	// ProtoHTTP is plain HTTP; the name is the Host header (or the host of
	// an absolute-form request URI).
	ProtoHTTP Protocol = "http"
	// ProtoTLS is a TLS connection; the name is the ClientHello's SNI. TLS
	// is never terminated.
	ProtoTLS Protocol = "tls"
	// ProtoConnect is an HTTP CONNECT tunnel; the name is the CONNECT
	// target's host.
	ProtoConnect Protocol = "connect"
	// ProtoBroker is a request to the credential broker, served in-process.
	ProtoBroker Protocol = "broker"
	// ProtoDNS is a query to the DNS responder.
	ProtoDNS Protocol = "dns"
)

// The reasons of Decisions. They are stable: audit events, tests and
// operators' alerts match on them.
const (
	ReasonAllowed        = "allowed"
	ReasonNameNotAllowed = "name not in allowlist"
	ReasonPortNotAllowed = "port not in allowlist"
	ReasonPrivateAddress = "resolved to a private address"
	ReasonIPLiteral      = "destination is an IP address, not a name"
	ReasonNoSNI          = "no SNI"
	ReasonNoHost         = "no Host header"
	ReasonBadName        = "invalid host name"
	ReasonBadRequest     = "malformed request"
	ReasonUnsupported    = "unsupported protocol"
	ReasonSNIMismatch    = "SNI does not match the CONNECT name"
	ReasonNoSuchName     = "name did not resolve"
	ReasonUpstreamFailed = "upstream unreachable"
	ReasonTimeout        = "timed out reading the request"
	ReasonTooManyConns   = "too many connections"
)

// Decision is the proxy's verdict on one connection (or one DNS question).
// Refusals are reported as soon as they are made; allowed connections when
// they end, with their byte counts.
type Decision struct {
	Allowed bool
	// Reason is one of the Reason constants; Detail adds specifics (the
	// refused address and its range, the upstream error).
	Reason string
	Detail string

	// Sandbox and Tool are the Policy's.
	Sandbox string
	Tool    string

	Protocol Protocol
	// Client is the sandbox side's address.
	Client string
	// Name is the destination name as the client sent it, canonicalised
	// where it could be; Port the destination port.
	Name string
	Port int
	// Addr is the address dialed, or the address refused; invalid when no
	// address was involved.
	Addr netip.Addr

	// BytesUp counts bytes from the sandbox to the upstream, BytesDown the
	// other way, of allowed connections.
	BytesUp   int64
	BytesDown int64

	Time     time.Time
	Duration time.Duration
}
