package netns

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// addRules installs n's table (family inet, so IPv6 is covered too):
//
//	table inet <prefix>_<n> {
//	  chain input { type filter hook input priority filter; policy accept;
//	    iifname H ip saddr S ip daddr A tcp dport {proxy ports} accept
//	    iifname H ip saddr S ip daddr A udp dport 53 accept
//	    iifname H ip saddr S ip daddr A tcp dport 53 accept
//	    iifname H drop }
//	  chain forward { type filter hook forward priority filter; policy accept;
//	    iifname H drop
//	    oifname H drop }
//	}
//
// where H is the host end of the veth, S the sandbox's address and A the
// host end's. A drop in any table is final, so other tables cannot open
// what this one closes; an accept here is not, so a host firewall that
// drops input must let the proxy's ports on the veths through.
func addRules(n *Net, proxyPorts []uint16, dnsPort uint16) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	accept := nftables.ChainPolicyAccept
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: n.Table})
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})

	iif := ifname(expr.MetaKeyIIFNAME, n.HostIf)
	allow := func(proto byte, port uint16) {
		e := append([]expr.Any{}, iif...)
		e = append(e,
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: n.SandboxAddr.AsSlice()},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: n.HostAddr.AsSlice()},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
			&expr.Verdict{Kind: expr.VerdictAccept},
		)
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: e})
	}
	for _, p := range proxyPorts {
		allow(unix.IPPROTO_TCP, p)
	}
	allow(unix.IPPROTO_UDP, dnsPort)
	allow(unix.IPPROTO_TCP, dnsPort)
	drop := func(ch *nftables.Chain, match []expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(append([]expr.Any{}, match...), &expr.Verdict{Kind: expr.VerdictDrop})})
	}
	drop(in, iif)
	drop(fwd, iif)
	drop(fwd, ifname(expr.MetaKeyOIFNAME, n.HostIf))
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing nftables table %s: %w", n.Table, err)
	}
	return nil
}

// ifname matches an interface name (IFNAMSIZ bytes, NUL-padded).
func ifname(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

// listTables returns the names of the inet tables.
func listTables() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables: %w", err)
	}
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.Name
	}
	return names, nil
}

// delTables deletes the inet tables whose name match accepts; a table that
// is already gone is success.
func delTables(match func(string) bool) error {
	names, err := listTables()
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if !match(name) {
			continue
		}
		c, err := nftables.New()
		if err != nil {
			return fmt.Errorf("opening nftables: %w", err)
		}
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("deleting nftables table %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
