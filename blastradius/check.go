package blastradius

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
	"github.com/stockade-sh/stockade/tools"
)

// This file compares what the probe found with the record: each check is
// one rule of the record, or of the security profile every record implies
// (sandbox/profile, whose facts it reads and does not restate), and a check
// that fails is a Deviation.

// evaluate turns the observations into the report for tool t, whose
// sandbox driver (its Name), with capabilities caps, made, against profile
// p.
func evaluate(p profile.Profile, driver string, caps sandbox.Capabilities, t tools.Tool, o *observed) *Report {
	l := t.EffectiveLimits()
	e := &evaluator{p: p, on: profile.On{Driver: driver, Tier: caps.Tier}, caps: caps, t: t, o: o, r: &o.reach, limits: l}
	r := &Report{
		Tool:              t.Name,
		RecordFingerprint: tools.Fingerprint(t),
		Tier:              t.Tier,
		RecordLimits: Limits{
			MemoryBytes: l.Memory, Pids: l.Pids, CPU: l.CPU,
			TmpSizeBytes: l.TmpSize, TimeoutMS: l.Timeout.Milliseconds(),
		},
	}
	r.Sections = []Section{
		e.environment(), e.identity(), e.namespaces(), e.mounts(), e.filesystem(),
		e.devices(), e.sockets(), e.network(), e.limitsSection(),
	}
	r.Deviations = deviations(r.Sections)
	return r
}

type evaluator struct {
	p profile.Profile
	// caps are the declared capabilities of the driver that made the
	// sandbox: where its program talks to the host kernel directly
	// (SharedKernel), the seccomp filter is the boundary.
	caps sandbox.Capabilities
	// on is the driver and tier: the differences declared there are
	// accepted.
	on     profile.On
	t      tools.Tool
	o      *observed
	r      *rawReach
	limits sandbox.Limits
}

// difference returns the profile's difference id declared for the
// sandbox's driver and tier.
func (e *evaluator) difference(id string) (profile.Difference, bool) {
	return e.p.Difference(e.on, id)
}

// section starts a section; add appends checks to it.
type sectionBuilder struct{ s Section }

func newSection(name, title string) *sectionBuilder {
	return &sectionBuilder{s: Section{Name: name, Title: title, Facts: []string{}, Checks: []Check{}}}
}

func (b *sectionBuilder) fact(format string, a ...any) {
	b.s.Facts = append(b.s.Facts, fmt.Sprintf(format, a...))
}

func (b *sectionBuilder) check(subject, observed, expected string, ok bool) {
	b.s.Checks = append(b.s.Checks, Check{Section: b.s.Name, Subject: subject, Observed: observed, Expected: expected, Deviation: !ok})
}

// ---------------------------------------------------------------------------

func (e *evaluator) environment() Section {
	b := newSection("environment", "Environment")
	want := map[string]string{}
	var wantNames []string
	for _, kv := range e.p.Env {
		k, v, _ := strings.Cut(kv, "=")
		want[k] = v
		wantNames = append(wantNames, k)
	}
	expected := "exactly the program environment (" + strings.Join(wantNames, ", ") + ")"
	var shown []string
	for _, name := range e.r.Env {
		if name == "PATH" {
			shown = append(shown, "PATH="+e.r.Path)
		} else {
			shown = append(shown, name+"=<redacted>")
		}
	}
	b.fact("%s: %s", plural(len(e.r.Env), "variable"), orNone(strings.Join(shown, " ")))
	b.fact("values other than PATH's never leave the sandbox")
	bad := 0
	for _, name := range e.r.Env {
		if _, ok := want[name]; !ok {
			b.check(name, "variable "+name+" is set", expected, false)
			bad++
		}
	}
	for _, name := range wantNames {
		if !slices.Contains(e.r.Env, name) {
			b.check(name, "variable "+name+" is missing", expected, false)
			bad++
		}
	}
	if bad == 0 {
		b.check("variables", strings.Join(e.r.Env, ", "), expected, true)
	}
	if v, ok := want["PATH"]; ok && slices.Contains(e.r.Env, "PATH") {
		b.check("PATH", "PATH="+e.r.Path, "PATH="+v, e.r.Path == v)
	}
	return b.s
}

func (e *evaluator) identity() Section {
	b := newSection("identity", "Identity, capabilities and seccomp")
	c := e.r.Caps
	b.fact("uid %d euid %d gid %d egid %d, supplementary groups %s", c.UID, c.EUID, c.GID, c.EGID, orNone(joinInts(c.Groups)))
	uid, gid := int(e.p.User.UID), int(e.p.User.GID)
	okIDs := c.UID == uid && c.EUID == uid && c.GID == gid && c.EGID == gid &&
		!slices.ContainsFunc(c.Groups, func(g int) bool { return g != gid })
	b.check("user", fmt.Sprintf("uid %d gid %d groups %s", c.UID, c.GID, orNone(joinInts(c.Groups))), fmt.Sprintf("uid %d and gid %d, no other group", uid, gid), okIDs)

	// The five capability sets, as /proc/self/status and the system calls
	// show them.
	want, err := e.p.CapabilityMask()
	if err != nil {
		b.check("capabilities", err.Error(), "a profile of Linux capabilities", false)
	}
	_, noAmbient := e.difference("status-ambient")
	sets := []string{}
	nonZero := []string{}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		v, ok := c.Status[k]
		if !ok {
			continue
		}
		sets = append(sets, k+" "+v)
		if v != want {
			nonZero = append(nonZero, k+" "+v)
		}
	}
	for name, v := range map[string]string{"capget effective": c.Capget.Effective, "capget permitted": c.Capget.Permitted, "capget inheritable": c.Capget.Inheritable} {
		if c.Capget.Errno == 0 && v != want {
			nonZero = append(nonZero, name+" "+v)
		}
	}
	for name, v := range map[string]rawValue{"bounding (prctl)": c.Bounding, "ambient (prctl)": c.Ambient} {
		switch {
		case v.Errno == 0 && string(v.Value) != `"`+want+`"`:
			nonZero = append(nonZero, name+" "+strings.Trim(string(v.Value), `"`))
		case v.Errno != 0 && !(strings.HasPrefix(name, "ambient") && noAmbient):
			// A tier without an ambient set (the declared difference)
			// fails PR_CAP_AMBIENT; the set is empty by construction.
			nonZero = append(nonZero, name+" unreadable ("+v.attempt.String()+")")
		}
	}
	sort.Strings(nonZero)
	b.fact("capabilities: %s", orNone(strings.Join(sets, ", ")))
	expected, observed := "all five sets empty", "all empty"
	if len(e.p.Capabilities) > 0 {
		expected, observed = "all five sets "+want, "all "+want
	}
	if len(nonZero) > 0 {
		observed = strings.Join(nonZero, "; ")
	}
	b.check("capabilities", observed, expected, len(nonZero) == 0)

	nnp := strings.TrimSpace(string(c.NoNewPrivs.Value))
	wantNNP := map[bool]string{true: "1", false: "0"}[e.p.NoNewPrivs]
	b.fact("no_new_privs %s", nnp)
	b.check("no_new_privs", "no_new_privs "+nnp, "no_new_privs "+wantNNP, c.NoNewPrivs.Errno == 0 && nnp == wantNNP)

	mode := strings.TrimSpace(string(c.Seccomp.Value))
	b.fact("seccomp mode %s (PR_GET_SECCOMP), %q in /proc/self/status", mode, c.Status["Seccomp"])
	if e.caps.SharedKernel {
		b.check("seccomp", "mode "+mode, "mode 2 (filter) on a shared-kernel tier",
			c.Seccomp.Errno == 0 && mode == "2" && c.Status["Seccomp"] == "2")
	} else {
		b.fact("tier %s: the user-space kernel applies the profile itself; the mode it presents is informational", e.t.Tier)
	}
	return b.s
}

func (e *evaluator) namespaces() Section {
	b := newSection("namespaces", "Namespaces")
	b.s.Table = [][]string{{"namespace", "sandbox", "host", ""}}
	for _, ns := range e.r.Namespaces {
		host := e.o.hostNS[ns.Name]
		sb := ns.Link
		if ns.Errno != 0 {
			sb = "not presented (" + ns.attempt.String() + ")"
		}
		required := slices.ContainsFunc(e.p.Namespaces, func(n profile.Namespace) bool { return slices.Contains(n.Links, ns.Name) })
		verdict := "own"
		switch {
		case ns.Errno == 0 && ns.Link == host:
			verdict = "shared with the host"
		case ns.Errno != 0:
			verdict = "not presented"
		}
		if !required {
			verdict += " (not in the profile)"
		}
		b.s.Table = append(b.s.Table, []string{ns.Name, sb, orNone(host), verdict})
		if !required {
			continue
		}
		switch {
		case ns.Errno != 0 && !e.caps.SharedKernel:
			// The user-space kernel does not present this namespace:
			// the program cannot name, let alone join, the host's.
			b.check(ns.Name, "not presented by the "+string(e.t.Tier)+" kernel", "a namespace of its own", true)
		case ns.Errno != 0:
			b.check(ns.Name, "unreadable: "+ns.attempt.String(), "a namespace of its own, different from the host's", false)
		default:
			b.check(ns.Name, sb, "different from the host's "+host, host == "" || ns.Link != host)
		}
	}
	if e.caps.SharedKernel {
		own := false
		for _, ns := range e.r.Namespaces {
			own = own || (ns.Name == "user" && ns.Errno == 0 && ns.Link != e.o.hostNS["user"])
		}
		if own {
			b.fact("a user namespace of its own: uid %d inside is an unprivileged uid of this sandbox's on the host", e.p.User.UID)
		} else {
			b.fact("no user namespace of its own: uid %d inside is the host's", e.p.User.UID)
		}
	}
	return b.s
}

func (e *evaluator) filesystem() Section {
	b := newSection("filesystem", "Readable and writable paths")
	w := e.r.Walk
	b.fact("walked %d entries from / in %d ms (skipping /proc and /sys)", w.Entries, w.ElapsedMS)
	var by []string
	for _, m := range w.ReadableByMount {
		by = append(by, fmt.Sprintf("%d in %s", m.Files, m.MountPoint))
	}
	b.fact("readable files: %d (%s); unreadable: %d files, %d directories", w.ReadableFiles, orNone(strings.Join(by, ", ")), w.UnreadableFiles, w.UnreadableDirs)
	b.fact("writable directories: %s", orNone(strings.Join(w.WritableDirs, ", ")))
	b.fact("writable files: %s", orNone(strings.Join(w.WritableFiles, ", ")))
	if w.WritableCount > len(w.WritableDirs)+len(w.WritableFiles) {
		b.fact("(%d writable paths in all; the lists stop at %d each)", w.WritableCount, len(w.WritableDirs))
	}
	writableRoots := e.scratch()
	for _, m := range e.p.Mounts {
		if m.Writable {
			writableRoots = append(writableRoots, m.Path)
		}
	}
	expected := "writable only under " + strings.Join(writableRoots, ", ")
	outside := 0
	for _, p := range slices.Concat(w.WritableDirs, w.WritableFiles) {
		if !slices.ContainsFunc(writableRoots, func(r string) bool { return under(p, r) }) {
			b.check(p, "writable", expected, false)
			outside++
		}
	}
	if outside == 0 {
		b.check("writable paths", orNone(strings.Join(w.WritableDirs, ", ")), expected, true)
	}
	if w.Truncated {
		b.check("walk", fmt.Sprintf("stopped after %d entries: paths beyond were not checked", w.Entries), "a complete walk", false)
	}
	return b.s
}

func (e *evaluator) devices() Section {
	b := newSection("devices", "Devices (/dev)")
	// The minimal /dev, with what the tier declares it adds (the Sentry's
	// own emulated devices on gVisor).
	dev := e.p.DevOn(e.on)
	var devNames []string
	for _, d := range e.p.Dev.Devices {
		devNames = append(devNames, d.Name)
	}
	var list []string
	bad := 0
	for _, d := range e.r.Dev {
		desc := d.Name
		if d.Type == "char" || d.Type == "block" {
			desc = fmt.Sprintf("%s (%s %d:%d)", d.Name, d.Type, d.Major, d.Minor)
		}
		list = append(list, desc)
		top, _, _ := strings.Cut(d.Name, "/")
		switch {
		case !slices.Contains(dev.Names, top):
			b.check("/dev/"+d.Name, "exists ("+d.Type+")", "the minimal /dev", false)
			bad++
		case d.Type == "block":
			b.check("/dev/"+d.Name, fmt.Sprintf("block device %d:%d", d.Major, d.Minor), "no block device", false)
			bad++
		case d.Type == "char" && !dev.Allows(d.Major, d.Minor):
			b.check("/dev/"+d.Name, fmt.Sprintf("character device %d:%d", d.Major, d.Minor), "only "+strings.Join(devNames, ", ")+" and pty slaves", false)
			bad++
		}
	}
	b.fact("%s", orNone(strings.Join(list, ", ")))
	if bad == 0 {
		b.check("/dev", plural(len(e.r.Dev), "entry"), "the minimal /dev", true)
	}
	return b.s
}

func (e *evaluator) sockets() Section {
	b := newSection("unix_sockets", "Unix sockets")
	fsSockets := e.r.Walk.Sockets
	b.fact("on the filesystem: %s", orNone(strings.Join(fsSockets, ", ")))
	u := e.r.UnixSockets
	if u.Errno != 0 {
		b.fact("/proc/net/unix: unreadable (%s)", u.attempt.String())
	} else {
		b.fact("/proc/net/unix: %s named (%s), %d unnamed", strconv.Itoa(len(u.Paths)), orNone(strings.Join(u.Paths, ", ")), u.Unnamed)
	}
	// The sandbox's own sockets live in its scratch.
	roots := e.scratch()
	where := "outside " + strings.Join(roots, ", ")
	bad := 0
	for _, p := range slices.Concat(fsSockets, u.Paths) {
		if !slices.ContainsFunc(roots, func(r string) bool { return under(p, r) }) {
			b.check(p, "a unix socket is reachable", "no unix socket "+where, false)
			bad++
		}
	}
	if bad == 0 {
		b.check("unix sockets", "none "+where, "no unix socket "+where, true)
	}
	return b.s
}

func (e *evaluator) network() Section {
	b := newSection("network", "Network and outbound attempts")
	n := e.r.Net
	ifaces := uniqueSorted(slices.Concat(n.Netlink.Names, n.ProcNetDev, n.SysClassNet))
	b.fact("interfaces: %s; addresses: %s", orNone(strings.Join(ifaces, ", ")), orNone(strings.Join(n.Addresses.Addrs, ", ")))
	if !e.t.Egress.None() {
		// The audit's sandbox is an invocation's without approved network:
		// no interface but lo, as egress none. The allowlist is enforced by
		// the proxy, which this audit does not exercise.
		b.fact("the record allows egress to %s on ports %s once an invocation's network is approved; this sandbox has none, and the proxy's allowlist is not audited here",
			strings.Join(e.t.Egress.Allow, ", "), strings.Trim(strings.Join(strings.Fields(fmt.Sprint(e.t.Egress.Ports)), ", "), "[]"))
	}
	want := e.p.Network.Interfaces
	okIfaces := len(ifaces) > 0 && !slices.ContainsFunc(ifaces, func(s string) bool { return !slices.Contains(want, s) })
	b.check("interfaces", orNone(strings.Join(ifaces, ", ")), "only "+strings.Join(want, ", ")+" (egress none)", okIfaces)
	for _, a := range n.Addresses.Addrs {
		if !strings.HasPrefix(a, "127.") && !strings.HasPrefix(a, "::1/") {
			b.check("address "+a, "configured", "loopback addresses only", false)
		}
	}
	b.s.Table = [][]string{{"attempt", "target", "result"}}
	for _, a := range e.r.Outbound {
		var what string
		var failed bool
		switch a.Kind {
		case "tcp_host_loopback":
			what = "TCP connect to a listener on the host's 127.0.0.1"
			failed = a.Result != "connected"
		case "tcp_metadata":
			what = "TCP connect to the link-local metadata address"
			failed = a.Result != "connected"
		case "dns":
			what = "DNS lookup of " + a.Name
			// Any reply, even "no such name", means a resolver was
			// reachable.
			failed = a.Errno != 0
		default:
			what = a.Kind
			failed = a.Result != "connected" && a.Errno != 0
		}
		b.s.Table = append(b.s.Table, []string{what, a.Addr, a.Result})
		b.check(what+" ("+a.Addr+")", a.Result, "the attempt fails (egress none)", failed)
	}
	b.s.Table = append(b.s.Table, []string{"connections the host listener accepted", e.o.listenAddr, strconv.Itoa(int(e.o.accepted))})
	b.check("host listener "+e.o.listenAddr, fmt.Sprintf("accepted %d connections", e.o.accepted), "none accepted", e.o.accepted == 0)
	return b.s
}

func (e *evaluator) limitsSection() Section {
	b := newSection("limits", "Process and memory limits")
	al := auditLimits(e.limits)
	b.fact("the audit's sandbox has a wall clock of %s and an output cap of %d bytes, which the probe needs (the record's: %s, %d bytes); every other limit is the record's",
		al.Timeout, al.OutputCap, e.limits.Timeout, e.limits.OutputCap)
	lim := e.r.Limits
	b.s.Table = [][]string{{"limit", "record", "presented inside", "measured"}}

	// Processes: count the sandbox's tasks, fork until refused.
	p := e.o.pids
	presented := "no cgroup filesystem; RLIMIT_NPROC " + lim.RlimitNproc.Cur
	if lim.CgroupPidsMax.Path != "" {
		presented = lim.CgroupPidsMax.Path + " " + lim.CgroupPidsMax.Value
	}
	reached := p.TasksBefore + p.Forked
	var measured string
	var ok bool
	switch st := e.o.pidsRes.Status; {
	case st == sandbox.StatusOOMKilled || st == sandbox.StatusKilled:
		// The limit held, if not the way the record puts it: the
		// sandbox died before the payload got past it.
		measured = fmt.Sprintf("%d tasks + %d forks = %d, then the sandbox was %s", p.TasksBefore, p.Forked, reached, statusWords(st))
		ok = int64(reached) <= e.limits.Pids
		b.fact("the fork test ended its sandbox (%s): on gVisor each process also costs host memory charged to the sandbox's memory limit; the memory test ran in a second sandbox of the tool", statusWords(st))
	case st != sandbox.StatusSucceeded:
		measured = fmt.Sprintf("the fork test ended %s after %d tasks + %d forks", statusWords(st), p.TasksBefore, p.Forked)
	case p.Errno == 0:
		measured = fmt.Sprintf("%d tasks, then %d forks without refusal", p.TasksBefore, p.Forked)
	default:
		measured = fmt.Sprintf("%d tasks + %d forks = %d, then %s", p.TasksBefore, p.Forked, reached, p.attempt.String())
		ok = int64(reached) <= e.limits.Pids
	}
	b.s.Table = append(b.s.Table, []string{"processes", strconv.FormatInt(e.limits.Pids, 10), presented, measured})
	b.check("processes", measured, fmt.Sprintf("at most %d processes and threads", e.limits.Pids), ok)
	if lim.CgroupPidsMax.Path != "" {
		b.check(lim.CgroupPidsMax.Path, lim.CgroupPidsMax.Value, strconv.FormatInt(e.limits.Pids, 10), lim.CgroupPidsMax.Value == strconv.FormatInt(e.limits.Pids, 10))
	}

	// Memory: allocate past the limit.
	presented = "no cgroup filesystem; MemTotal " + sandbox.FormatSize(lim.MemTotal)
	if lim.CgroupMemoryMax.Path != "" {
		presented = lim.CgroupMemoryMax.Path + " " + lim.CgroupMemoryMax.Value
	}
	a, res := e.o.alloc, e.o.allocRes
	switch {
	case res.Status == sandbox.StatusSucceeded && a.Errno == 0:
		measured = fmt.Sprintf("allocated all %d MiB", a.AllocatedMiB)
		ok = false
	case res.Status == sandbox.StatusSucceeded:
		measured = fmt.Sprintf("allocation refused (%s) after %d MiB of %d MiB", a.attempt.String(), a.AllocatedMiB, e.o.allocMiB)
		ok = int64(a.AllocatedMiB)<<20 <= e.limits.Memory
	default:
		measured = fmt.Sprintf("%s after %d MiB of %d MiB", statusWords(res.Status), a.AllocatedMiB, e.o.allocMiB)
		ok = (res.Status == sandbox.StatusOOMKilled || res.Status == sandbox.StatusKilled) && int64(a.AllocatedMiB)<<20 <= e.limits.Memory
	}
	b.s.Table = append(b.s.Table, []string{"memory", sandbox.FormatSize(e.limits.Memory), presented, measured})
	b.check("memory", measured, "at most "+sandbox.FormatSize(e.limits.Memory), ok)
	if lim.CgroupMemoryMax.Path != "" {
		b.check(lim.CgroupMemoryMax.Path, lim.CgroupMemoryMax.Value, strconv.FormatInt(e.limits.Memory, 10), lim.CgroupMemoryMax.Value == strconv.FormatInt(e.limits.Memory, 10))
	}
	b.fact("RLIMIT_NOFILE %s, RLIMIT_AS %s", lim.RlimitNofile.Cur, lim.RlimitAS.Cur)
	return b.s
}

// ---------------------------------------------------------------------------

// statusWords says how a program ended, for the report.
func statusWords(s sandbox.Status) string {
	switch s {
	case sandbox.StatusOOMKilled:
		return "OOM-killed"
	case sandbox.StatusTimedOut:
		return "timed out"
	case "":
		return "not run"
	}
	return string(s)
}

// under reports whether p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

func hasOption(opts, o string) bool { return slices.Contains(strings.Split(opts, ","), o) }

func uniqueSorted(ss []string) []string {
	out := slices.Clone(ss)
	slices.Sort(out)
	return slices.Compact(out)
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "y") {
		return strconv.Itoa(n) + " " + strings.TrimSuffix(noun, "y") + "ies"
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
