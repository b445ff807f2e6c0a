package blastradius

import (
	"encoding/json"
	"strconv"
)

// This file mirrors the JSON the probe prints (sandbox/conformance/probe,
// subcommands reach, pidlimit and alloc). Everything in it came from inside
// the sandbox: it is parsed strictly by encoding/json and only ever
// compared or printed, never acted upon.

// attempt is how the probe reports a system call: errno 0 is success.
type attempt struct {
	Errno int    `json:"errno"`
	Err   string `json:"err"`
}

func (a attempt) String() string {
	switch {
	case a.Errno == 0:
		return "success"
	case a.Err != "":
		return a.Err
	}
	return "errno " + strconv.Itoa(a.Errno)
}

type rawValue struct {
	attempt
	Value json.RawMessage `json:"value"`
}

type rawReach struct {
	Env  []string `json:"env"`
	Path string   `json:"path"`
	Caps struct {
		Status map[string]string `json:"status"`
		Capget struct {
			attempt
			Effective   string `json:"effective"`
			Permitted   string `json:"permitted"`
			Inheritable string `json:"inheritable"`
		} `json:"capget"`
		CapsChecked int      `json:"caps_checked"`
		Bounding    rawValue `json:"bounding"`
		Ambient     rawValue `json:"ambient"`
		NoNewPrivs  rawValue `json:"no_new_privs"`
		Seccomp     rawValue `json:"seccomp"`
		UID         int      `json:"uid"`
		EUID        int      `json:"euid"`
		GID         int      `json:"gid"`
		EGID        int      `json:"egid"`
		Groups      []int    `json:"groups"`
	} `json:"caps"`
	Namespaces []struct {
		attempt
		Name string `json:"name"`
		Link string `json:"link"`
	} `json:"namespaces"`
	Mounts []struct {
		MountPoint   string `json:"mount_point"`
		Root         string `json:"root"`
		Options      string `json:"options"`
		FSType       string `json:"fstype"`
		Source       string `json:"source"`
		SuperOptions string `json:"super_options"`
	} `json:"mounts"`
	Walk struct {
		Entries         int  `json:"entries"`
		Truncated       bool `json:"truncated"`
		ElapsedMS       int  `json:"elapsed_ms"`
		ReadableFiles   int  `json:"readable_files"`
		ReadableByMount []struct {
			MountPoint string `json:"mount_point"`
			Files      int    `json:"files"`
		} `json:"readable_by_mount"`
		UnreadableFiles int      `json:"unreadable_files"`
		UnreadableDirs  int      `json:"unreadable_dirs"`
		WritableDirs    []string `json:"writable_dirs"`
		WritableFiles   []string `json:"writable_files"`
		WritableCount   int      `json:"writable_count"`
		Sockets         []string `json:"sockets"`
	} `json:"walk"`
	Dev []struct {
		attempt
		Name  string `json:"name"`
		Type  string `json:"type"`
		Major int    `json:"major"`
		Minor int    `json:"minor"`
	} `json:"dev"`
	UnixSockets struct {
		attempt
		Paths   []string `json:"paths"`
		Unnamed int      `json:"unnamed"`
	} `json:"unix_sockets"`
	Net struct {
		Netlink struct {
			attempt
			Names []string `json:"names"`
		} `json:"netlink"`
		ProcNetDev  []string `json:"proc_net_dev"`
		SysClassNet []string `json:"sys_class_net"`
		Addresses   struct {
			attempt
			Addrs []string `json:"addrs"`
		} `json:"addresses"`
	} `json:"net"`
	Outbound []struct {
		Kind   string `json:"kind"`
		Addr   string `json:"addr"`
		Name   string `json:"name"`
		Note   string `json:"note"`
		Result string `json:"result"`
		Errno  int    `json:"errno"`
	} `json:"outbound"`
	Limits struct {
		CgroupPidsMax   rawFile  `json:"cgroup_pids_max"`
		CgroupMemoryMax rawFile  `json:"cgroup_memory_max"`
		RlimitNproc     rawLimit `json:"rlimit_nproc"`
		RlimitAS        rawLimit `json:"rlimit_as"`
		RlimitNofile    rawLimit `json:"rlimit_nofile"`
		MemTotal        int64    `json:"meminfo_total_bytes"`
		Tasks           int      `json:"tasks"`
	} `json:"limits"`
}

type rawFile struct {
	Path  string `json:"path"`
	Value string `json:"value"`
}

type rawLimit struct {
	attempt
	Cur string `json:"cur"`
	Max string `json:"max"`
}

type rawPidLimit struct {
	attempt
	TasksBefore int `json:"tasks_before"`
	Forked      int `json:"forked"`
	Max         int `json:"max"`
}

type rawAlloc struct {
	attempt
	AllocatedMiB int `json:"allocated_mib"`
}
