package main

import (
	"bytes"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds the network subcommand, net.

// netProbe lists interfaces three ways and tries a TCP connection to each
// address.
func netProbe(addrs []string) obj {
	links, linkErr := netlinkNames()
	var procNet []string
	b, _ := readLimited("/proc/net/dev", 64<<10)
	for i, line := range strings.Split(string(b), "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok && i >= 2 {
			procNet = append(procNet, strings.TrimSpace(name))
		}
	}
	if procNet == nil {
		procNet = []string{}
	}
	ifaddrs, addrErr := netlinkAddrs()
	var connects []obj
	for _, a := range addrs {
		connects = append(connects, tcpConnect(a))
	}
	return obj{
		{"netlink", append(obj{{"names", links}}, attempt(linkErr)...)},
		{"proc_net_dev", procNet},
		{"sys_class_net", listDir("/sys/class/net")},
		{"addresses", append(obj{{"addrs", ifaddrs}}, attempt(addrErr)...)},
		{"connect", connects},
		{"loopback_connect", loopbackConnect()},
		{"udp_socket", obj(attempt(socketOf(unix.AF_INET, unix.SOCK_DGRAM, 0)))},
		{"ping_socket", obj(attempt(socketOf(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)))},
		{"ping6_socket", obj(attempt(socketOf(unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_ICMPV6)))},
		// The kernels read the protocol as 32 bits: with garbage in the
		// high ones it is still ICMP.
		{"ping_socket_high_bits", obj(attempt(socketOf(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP|1<<32)))},
		{"high_port", obj(attempt(bindPort(0)))},
		{"low_port", obj(attempt(bindPort(80)))},
	}
}

// socketOf opens a socket with a raw system call (the protocol as the
// caller gives it, all 64 bits) and closes it. Unprivileged ICMP sockets
// are allowed by the kernel only to groups in net.ipv4.ping_group_range.
func socketOf(domain, typ int, protocol uint64) error {
	fd, _, e := syscall.RawSyscall(syscall.SYS_SOCKET, uintptr(domain), uintptr(typ|unix.SOCK_CLOEXEC), uintptr(protocol))
	if e != 0 {
		return e
	}
	syscall.Close(int(fd))
	return nil
}

// bindPort binds a TCP socket to 127.0.0.1:port. Below
// net.ipv4.ip_unprivileged_port_start that needs CAP_NET_BIND_SERVICE;
// port 0 (any free port) is the control that binding works at all.
func bindPort(port int) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
}

// loopbackConnect listens on the sandbox's own loopback and connects to it
// the way tcpConnect tries the host: the control that a connection that can
// be made is reported as "connected".
func loopbackConnect() obj {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return obj{{"addr", ""}, {"result", "socket: " + unix.ErrnoName(errnoOf(err))}, {"errno", int(errnoOf(err))}}
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return obj{{"addr", ""}, {"result", "bind: " + unix.ErrnoName(errnoOf(err))}, {"errno", int(errnoOf(err))}}
	}
	if err := syscall.Listen(fd, 1); err != nil {
		return obj{{"addr", ""}, {"result", "listen: " + unix.ErrnoName(errnoOf(err))}, {"errno", int(errnoOf(err))}}
	}
	sa, err := syscall.Getsockname(fd)
	in4, ok := sa.(*syscall.SockaddrInet4)
	if err != nil || !ok {
		return obj{{"addr", ""}, {"result", "getsockname failed"}, {"errno", -1}}
	}
	return tcpConnect(netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)).String())
}

func netlinkNames() ([]string, error) {
	names := []string{}
	tab, err := syscall.NetlinkRIB(syscall.RTM_GETLINK, syscall.AF_UNSPEC)
	if err != nil {
		return names, err
	}
	msgs, err := syscall.ParseNetlinkMessage(tab)
	if err != nil {
		return names, err
	}
	for i := range msgs {
		if msgs[i].Header.Type != syscall.RTM_NEWLINK {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&msgs[i])
		if err != nil {
			continue
		}
		for _, a := range attrs {
			if a.Attr.Type == syscall.IFLA_IFNAME {
				names = append(names, string(bytes.TrimRight(a.Value, "\x00")))
			}
		}
	}
	return names, nil
}

func netlinkAddrs() ([]string, error) {
	out := []string{}
	tab, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_UNSPEC)
	if err != nil {
		return out, err
	}
	msgs, err := syscall.ParseNetlinkMessage(tab)
	if err != nil {
		return out, err
	}
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != syscall.RTM_NEWADDR || len(m.Data) < syscall.SizeofIfAddrmsg {
			continue
		}
		ifa := (*syscall.IfAddrmsg)(unsafe.Pointer(&m.Data[0]))
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			continue
		}
		for _, a := range attrs {
			if a.Attr.Type != syscall.IFA_ADDRESS {
				continue
			}
			if ip, ok := netip.AddrFromSlice(a.Value); ok {
				out = append(out, ip.String()+"/"+strconv.Itoa(int(ifa.Prefixlen))+" index "+strconv.Itoa(int(ifa.Index)))
			}
		}
	}
	return out, nil
}

// tcpConnect tries to connect to addr ("ip:port") for at most 2 s. The
// result is "connected", "timeout" or the errno's name.
func tcpConnect(addr string) obj {
	o := obj{{"addr", addr}}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return append(o, field{"result", "bad address"}, field{"errno", -1})
	}
	var sa unix.Sockaddr
	family := unix.AF_INET
	if ap.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return append(o, field{"result", "socket: " + unix.ErrnoName(errnoOf(err))}, field{"errno", int(errnoOf(err))})
	}
	defer unix.Close(fd)
	err = unix.Connect(fd, sa)
	if err == unix.EINPROGRESS {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, perr := unix.Poll(pfd, 2000)
		switch {
		case perr != nil:
			err = perr
		case n == 0:
			return append(o, field{"result", "timeout"}, field{"errno", -1})
		default:
			var soErr int
			soErr, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
			if err == nil && soErr != 0 {
				err = syscall.Errno(soErr)
			}
		}
	}
	if err == nil {
		return append(o, field{"result", "connected"}, field{"errno", 0})
	}
	e := errnoOf(err)
	return append(o, field{"result", unix.ErrnoName(e)}, field{"errno", int(e)})
}
