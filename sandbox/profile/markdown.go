package profile

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/stockade-sh/stockade/sandbox"
)

// Markdown renders the profile as the README's table of it: one row per
// control, every value as the consumers read it.
func (p *Profile) Markdown() string {
	var b strings.Builder
	row := func(control, value string) { fmt.Fprintf(&b, "| %s | %s |\n", control, value) }
	b.WriteString("| control | value |\n| --- | --- |\n")
	if p.ReadOnlyRoot {
		row("root", "the runtime image, read-only")
	} else {
		row("root", "the runtime image, writable")
	}
	var scratch []string
	for _, s := range p.Scratch {
		where := ""
		if s.SessionOnly {
			where = ", in a session's sandbox only"
		}
		scratch = append(scratch, fmt.Sprintf("`%s`%s (%s)", s.Path, where, options(s.Options)))
	}
	row("scratch", fmt.Sprintf("tmpfs mounts of the tool's scratch size (%s by default): %s", sandbox.FormatSize(p.Limits.TmpSize), strings.Join(scratch, "; ")))
	row("host paths", fmt.Sprintf("only the image; the guest agent at `%s` (%s); a tool's data mounts below `%s` (%s), whose mount points are on a tmpfs of root's (%s); with egress, `%s` (%s)",
		p.Guest.Path, options(p.Guest.Options), p.Data.Dir, options(p.Data.Options), options(p.Data.ParentOptions), p.ResolvConf.Path, options(p.ResolvConf.Options)))
	row("user", fmt.Sprintf("uid %d, gid %d, no supplementary group", p.User.UID, p.User.GID))
	if len(p.Capabilities) == 0 {
		row("capabilities", "none, in all five sets")
	} else {
		row("capabilities", strings.Join(p.Capabilities, ", ")+", in all five sets")
	}
	row("no_new_privs", map[bool]string{true: "set", false: "not set"}[p.NoNewPrivs])
	row("seccomp", p.Seccomp.markdown())
	var ns []string
	for _, n := range p.Namespaces {
		ns = append(ns, n.Type)
	}
	row("namespaces", strings.Join(ns, ", ")+"; a user namespace too where the tier has one")
	var sysctls []string
	for _, s := range p.Network.Sysctls {
		sysctls = append(sysctls, fmt.Sprintf("%s `%s`", s.Name, s.Value))
	}
	row("network", fmt.Sprintf("without egress, only %s; %s", strings.Join(p.Network.Interfaces, ", "), strings.Join(sysctls, ", ")))
	l := p.Limits
	row("limits", fmt.Sprintf("memory %s without swap, %d pids, wall clock %s, stdout and stderr %s each, `/tmp` %s; CPU the tier's default",
		sandbox.FormatSize(l.Memory), l.Pids, sandbox.FormatDuration(l.Timeout), sandbox.FormatSize(l.OutputCap), sandbox.FormatSize(l.TmpSize)))
	var rl []string
	for _, r := range p.Rlimits {
		v := strconv.FormatUint(r.Hard, 10)
		if r.Soft != r.Hard {
			v = strconv.FormatUint(r.Soft, 10) + " (hard " + v + ")"
		}
		rl = append(rl, r.Type+" "+v)
	}
	row("rlimits", strings.Join(rl, ", "))
	env := make([]string, len(p.Env))
	for i, e := range p.Env {
		env[i] = "`" + e + "`"
	}
	row("environment", strings.Join(env, ", ")+", nothing else")
	row("hostname", "`"+p.Hostname+"`")
	var mounts []string
	for _, m := range p.Mounts {
		mounts = append(mounts, fmt.Sprintf("`%s` %s (%s)", m.Path, m.Type, options(m.Options)))
	}
	row("kernel file systems", strings.Join(mounts, ", "))
	row("masked paths", code(p.MaskedPaths))
	row("read-only paths", code(p.ReadOnlyPaths))
	var devs []string
	for _, d := range p.Dev.Devices {
		devs = append(devs, fmt.Sprintf("%s %d:%d", d.Name, d.Major, d.Minor))
	}
	row("/dev", fmt.Sprintf("only %s; character devices %s and pseudo-terminals (major %d)", strings.Join(p.Dev.Names, ", "), strings.Join(devs, ", "), p.Dev.PTYMajor))
	return b.String()
}

func (s Seccomp) markdown() string {
	var fams []string
	for _, f := range s.SocketFamilies {
		fams = append(fams, f.Name)
	}
	var nosys []string
	for _, r := range s.ENOSYS {
		nosys = append(nosys, r.Name+" answers ENOSYS ("+r.Why+")")
	}
	v := fmt.Sprintf("%s, without %s; socket(2) of %s only; %s refused whatever the high 32 bits of the request (%s); %s",
		s.Base, strings.Join(s.Denied, ", "), strings.Join(fams, ", "), s.RefusedIoctl.Name, s.RefusedIoctl.Why, strings.Join(nosys, "; "))
	if s.NativeOnly {
		v += "; built for the host's architecture, whose system calls alone are allowed: a call of another architecture kills the caller"
	}
	return v
}

// DifferencesMarkdown renders the known differences of the tiers and
// drivers as the README's table of them.
func (p *Profile) DifferencesMarkdown() string {
	var b strings.Builder
	b.WriteString("| tier or driver | difference | why the profile holds |\n| --- | --- | --- |\n")
	for _, d := range p.Differences {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", d.Where(), d.Fact, d.Reason)
	}
	return b.String()
}

func options(o []string) string { return strings.Join(o, ", ") }

func code(paths []string) string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = "`" + p + "`"
	}
	return strings.Join(out, ", ")
}
