// Package egress is the host side of a sandbox's network (docs/design.md
// §7): an egress proxy that lets a sandbox reach the names its tool's record
// allows and nothing else, and a DNS responder that answers only those
// names. Together with internal/netns (the sandbox's namespace, veth and
// host rules) and package broker (credentials), it is the only way out of a
// sandbox that was granted network.
//
// # How traffic flows
//
// internal/netns gives the sandbox a namespace whose only interface is a
// veth to the host, and host rules that drop every packet from it except
// TCP to the proxy's ports and DNS on the host end. The sandbox's
// resolv.conf names the host end. There:
//
//   - DNS (ServeDNS) answers A questions for allowlisted names (and
//     BrokerName when the tool lists broker operations) with the host end's
//     own address, NXDOMAIN for every other name, and never forwards a
//     query: a lookup cannot carry data out, and a random label costs
//     nothing upstream.
//   - The proxy (Proxy.Start, one Gate per sandbox) listens on the host end
//     on each allowed port, plus 80 for the broker. A client that resolved
//     an allowed name therefore connects to the proxy on the port it meant.
//     The proxy learns the name from the first bytes, without terminating
//     anything: plain HTTP's Host header, TLS's SNI (the ClientHello is
//     parsed by crypto/tls itself and forwarded byte for byte), or a
//     CONNECT target for clients configured to use a proxy.
//   - It checks name and port against the allowlist (exact names, "*."
//     wildcards below a domain), resolves the name itself, refuses every
//     address that is not public unicast (loopback, RFC 1918, link-local and
//     169.254.169.254, CGNAT, 0.0.0.0/8, multicast, reserved and
//     documentation ranges, IPv6 ULA and link-local, NAT64/6to4 wrappings of
//     those, the host's own addresses), and dials exactly the address it
//     checked, checking it once more on the socket (net.Dialer.Control):
//     DNS rebinding cannot slip a private address in between.
//   - Requests for BrokerName are served in process by the sandbox's broker
//     handler, never resolved or dialed.
//
// Every refusal is a Decision with a stable Reason ("name not in
// allowlist", "resolved to a private address", "no SNI", ...) handed to
// Config.OnDecision, where the daemon writes its audit events and its log
// lines, and logged at Debug (the first clip.MaxLines of a sandbox).
// Allowed connections are reported when they end, with byte counts.
//
// # Bounds
//
// Every read has a deadline: HeaderTimeout for the request or ClientHello,
// IdleTimeout afterwards (a direction may idle while the other is busy),
// MaxConnDuration overall. Headers and ClientHellos are bounded by
// MaxHeaderBytes, each direction of a connection by MaxBytes, a Gate's
// concurrent connections by MaxConns. Plain HTTP is one request per
// connection (Connection: close upstream), so every request's Host is
// checked.
//
// # What it does not do
//
// TLS is not terminated, so the proxy cannot see the Host header inside
// TLS: a client can front for another name served from the same address
// as an allowed one (domain fronting), or use Encrypted Client Hello with
// an allowed public name. An allowlist entry therefore trusts the whole
// endpoint behind the name; prefer narrow names over CDN-wide wildcards.
// Inside a CONNECT tunnel a ClientHello whose SNI differs from the CONNECT
// name is refused. There is no IPv6 path out of a sandbox (AAAA questions
// get no record unless DNSConfig.AnswerV6 is set) and no UDP beyond DNS,
// so QUIC falls back to TCP.
//
// # Tests
//
// Tests run real upstreams on loopback, which the proxy refuses. A
// TestOverride maps test names to them; it can only be made with a
// running test's testing.TB and Config.Validate refuses it outside a test
// binary, so no configuration can turn it on.
//
//	p, err := egress.New(egress.Config{OnDecision: audit})
//	g, err := p.Start(ctx, egress.Policy{Sandbox: id, Tool: t.Name, Allow: t.Egress.Allow, Ports: t.Egress.Ports, Broker: h},
//		egress.Listener{Listener: l443}, egress.Listener{Listener: l80})
//	defer g.Close()
//	d, err := egress.ServeDNS(ctx, egress.DNSConfig{Sandbox: id, Allow: t.Egress.Allow, Broker: h != nil, Answer: n.HostAddr}, udp53, tcp53)
//	defer d.Close()
package egress
