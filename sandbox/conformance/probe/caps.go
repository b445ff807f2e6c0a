package main

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// This file holds the privileges subcommand, caps.

// caps reports the capability sets both as /proc/self/status shows them and
// as the system calls do (gVisor's status has no CapAmb or NoNewPrivs line).
func caps() obj {
	st := statusFields("/proc/self/status")
	status := obj{}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Seccomp_filters", "Uid", "Gid", "Groups"} {
		if v, ok := st[k]; ok {
			status = append(status, field{k, v})
		}
	}
	o := obj{{"status", status}}

	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	err := unix.Capget(&hdr, &data[0])
	o = append(o, field{"capget", append(obj{
		{"effective", hex64(uint64(data[0].Effective) | uint64(data[1].Effective)<<32)},
		{"permitted", hex64(uint64(data[0].Permitted) | uint64(data[1].Permitted)<<32)},
		{"inheritable", hex64(uint64(data[0].Inheritable) | uint64(data[1].Inheritable)<<32)},
	}, attempt(err)...)})

	// The bounding and ambient sets, one capability at a time, up to the
	// first number the kernel does not know.
	var bnd, amb uint64
	var bndErr, ambErr error
	checked := 0
	for c := 0; c < 64; c++ {
		r, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil {
			if c == 0 {
				bndErr = err
			}
			break
		}
		checked++
		if r == 1 {
			bnd |= 1 << c
		}
		r, err = unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c), 0, 0)
		if err != nil {
			if c == 0 {
				ambErr = err
			}
			continue
		}
		if r == 1 {
			amb |= 1 << c
		}
	}
	o = append(o,
		field{"caps_checked", checked},
		field{"bounding", append(obj{{"value", hex64(bnd)}}, attempt(bndErr)...)},
		field{"ambient", append(obj{{"value", hex64(amb)}}, attempt(ambErr)...)},
	)

	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	o = append(o, field{"no_new_privs", append(obj{{"value", nnp}}, attempt(err)...)})
	sec, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0)
	o = append(o, field{"seccomp", append(obj{{"value", sec}}, attempt(err)...)})

	groups, _ := syscall.Getgroups()
	if groups == nil {
		groups = []int{}
	}
	return append(o,
		field{"uid", syscall.Getuid()}, field{"euid", syscall.Geteuid()},
		field{"gid", syscall.Getgid()}, field{"egid", syscall.Getegid()},
		field{"groups", groups},
	)
}
