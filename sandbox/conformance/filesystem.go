package conformance

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// The checks of the sandbox's filesystem: a read-only root, a size-capped
// /tmp, read-only /proc and /sys, a minimal /dev and no mount of the host's.

type fsReport struct {
	Writes []struct {
		errno
		Path string `json:"path"`
		Op   string `json:"op"`
	} `json:"writes"`
	Statfs []struct {
		errno
		Path   string `json:"path"`
		RO     bool   `json:"ro"`
		NoSUID bool   `json:"nosuid"`
		NoDev  bool   `json:"nodev"`
		Size   int64  `json:"size"`
		Flags  int64  `json:"flags"`
	} `json:"statfs"`
	ProcSys struct {
		Tried    int            `json:"tried"`
		Writable []string       `json:"writable"`
		Errnos   map[string]int `json:"errnos"`
	} `json:"proc_sys"`
	TmpFill struct {
		errno
		Written int64 `json:"written"`
	} `json:"tmp_fill"`
	Dev []struct {
		errno
		Name  string `json:"name"`
		Type  string `json:"type"`
		Major int    `json:"major"`
		Minor int    `json:"minor"`
	} `json:"dev"`
	Mounts []struct {
		MountPoint string `json:"mount_point"`
		FSType     string `json:"fstype"`
		Source     string `json:"source"`
		Options    string `json:"options"`
	} `json:"mounts"`
}

func (s *suite) filesystem(t *testing.T) {
	b := s.start(t, sandbox.Limits{TmpSize: tmpSize})
	hostFiles := s.hostFiles()
	var r fsReport
	args := []string{"fs"}
	for _, f := range hostFiles {
		args = append(args, f.Path)
	}
	b.report(t, &r, args...)
	writeOp := func(t *testing.T, path, op string) errno {
		t.Helper()
		for _, w := range r.Writes {
			if w.Path == path && (op == "" || w.Op == op) {
				return w.errno
			}
		}
		t.Fatalf("the probe did not report a write (%s) to %s", op, path)
		return errno{}
	}
	write := func(t *testing.T, path string) errno {
		t.Helper()
		return writeOp(t, path, "")
	}
	statfs := func(t *testing.T, path string) (ro, nosuid, nodev bool, size int64) {
		t.Helper()
		for _, st := range r.Statfs {
			if st.Path == path {
				if st.Errno != 0 {
					t.Fatalf("statfs %s: %s", path, st.errno)
				}
				return st.RO, st.NoSUID, st.NoDev, st.Size
			}
		}
		t.Fatalf("the probe did not report statfs of %s", path)
		return
	}

	t.Run("RootReadOnly", func(t *testing.T) {
		_, permissionsFirst := s.difference("root-eacces")
		eacces := 0
		for _, p := range []string{
			"/.stockade-probe", "/etc/.stockade-probe", "/usr/bin/.stockade-probe", "/.stockade/.stockade-probe",
			"/var/tmp/.stockade-probe", "/.stockade-probe-dir", "/usr/.stockade-probe-dir",
		} {
			// A read-only mount answers EROFS before file permissions
			// are checked; anything else means only the image's file
			// modes stand in the way.
			e := write(t, p)
			if e.is(syscall.EACCES) && permissionsFirst && p != "/var/tmp/.stockade-probe" {
				eacces++
				continue
			}
			if !e.is(syscall.EROFS) {
				t.Errorf("creating %s: got %s, want EROFS", p, e)
			}
		}
		s.expect(t, "root-eacces", eacces == 0, "creating files in root's directories of the image: got EACCES %d times, want EROFS", eacces)
		for _, p := range []string{s.p.Guest.Path, "/etc/passwd", "/bin/busybox"} {
			if e := write(t, p); e.Errno == 0 {
				t.Errorf("opening %s for writing: got success, want refused", p)
			}
		}
		for p, want := range map[string]bool{"/": s.p.ReadOnlyRoot, "/etc": s.p.ReadOnlyRoot, "/usr/bin": s.p.ReadOnlyRoot, s.p.Guest.Path: slices.Contains(s.p.Guest.Options, "ro")} {
			if ro, _, _, _ := statfs(t, p); ro != want {
				t.Errorf("statfs %s: got read-only %t, want %t", p, ro, want)
			}
		}
	})

	t.Run("Tmp", func(t *testing.T) {
		if e := write(t, "/tmp/.stockade-probe"); e.Errno != 0 {
			t.Errorf("creating a file in /tmp: got %s, want success", e)
		}
		f := r.TmpFill
		t.Logf("filling /tmp (cap %d bytes) wrote %d bytes, then %s", tmpSize, f.Written, f.errno)
		if !f.is(syscall.ENOSPC) {
			t.Errorf("filling /tmp: got %s, want ENOSPC", f.errno)
		}
		if f.Written > tmpSize || f.Written < tmpSize/2 {
			t.Errorf("filling /tmp: wrote %d bytes, want between %d and %d (the cap)", f.Written, tmpSize/2, tmpSize)
		}
		tmp, _ := s.p.ScratchAt("/tmp")
		_, nosuid, nodev, size := statfs(t, "/tmp")
		if slices.Contains(tmp.Options, "nosuid") {
			s.expect(t, "tmp-nosuid", nosuid, "statfs /tmp: got nosuid=false, want nosuid")
		} else if nosuid {
			t.Errorf("statfs /tmp: got nosuid=true, want false")
		}
		// What nosuid guards against, on every tier: a set-uid file of
		// another user's. The program's own file is its to give away
		// only with CAP_CHOWN; giving it to its owner shows that chown
		// reaches it.
		const own = "/tmp/.stockade-probe-suid"
		if e := writeOp(t, own, "chmod_suid"); e.Errno != 0 {
			t.Errorf("chmod 06755 of the program's file in /tmp: got %s, want success", e)
		}
		if e := writeOp(t, own, "chown_self"); e.Errno != 0 {
			t.Errorf("chown of the program's file in /tmp to its owner: got %s, want success", e)
		}
		if e := writeOp(t, own, "chown_root"); !e.is(syscall.EPERM) {
			t.Errorf("chown of the program's set-uid file in /tmp to root: got %s, want EPERM (no CAP_CHOWN)", e)
		}
		if slices.Contains(tmp.Options, "nodev") {
			s.expect(t, "tmp-nodev", nodev, "statfs /tmp: got nodev=false, want nodev")
		}
		// What nodev guards against, on every tier: a device node made
		// there. A FIFO, which needs no privilege, shows that mknod
		// reaches /tmp at all.
		if e := write(t, "/tmp/.stockade-probe-fifo"); e.Errno != 0 {
			t.Errorf("mknod of a FIFO in /tmp: got %s, want success", e)
		}
		if e := write(t, "/tmp/.stockade-probe-dev"); !e.is(syscall.EPERM) {
			t.Errorf("mknod of character device 1:3 in /tmp: got %s, want EPERM (no CAP_MKNOD)", e)
		}
		if size > tmpSize {
			t.Errorf("statfs /tmp: got size %d, want at most %d", size, tmpSize)
		}
	})

	t.Run("ProcAndSysReadOnly", func(t *testing.T) {
		if e := write(t, "/proc/self/comm"); e.Errno != 0 {
			t.Errorf("opening /proc/self/comm (the process's own) for writing: got %s, want success", e)
		}
		for _, p := range []string{"/proc/sysrq-trigger", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/uevent_helper"} {
			if e := write(t, p); e.Errno == 0 {
				t.Errorf("opening %s for writing: got success, want refused", p)
			}
		}
		ps := r.ProcSys
		t.Logf("opened %d files below /proc/sys for writing: refused %v", ps.Tried, ps.Errnos)
		if ps.Tried < 20 {
			t.Errorf("the probe tried %d files below /proc/sys, want the whole tree (at least 20)", ps.Tried)
		}
		for _, p := range ps.Writable {
			t.Errorf("opening %s for writing: got success, want refused", p)
		}
		for _, m := range s.p.Mounts {
			if m.Path == "/sys" {
				if ro, _, _, _ := statfs(t, "/sys"); ro != slices.Contains(m.Options, "ro") {
					t.Errorf("statfs /sys: got read-only %t, want the profile's options %v", ro, m.Options)
				}
			}
		}
		if slices.Contains(s.p.ReadOnlyPaths, "/proc/sys") {
			ro, _, _, _ := statfs(t, "/proc/sys")
			s.expect(t, "proc-sys-rw", ro, "statfs /proc/sys: got read-write, want read-only (readonlyPaths)")
		}
	})

	t.Run("DevMinimal", func(t *testing.T) {
		dev := s.p.DevOn(s.on)
		present := map[string]bool{}
		for _, d := range r.Dev {
			present[d.Name] = true
		}
		if !present["null"] || !present["zero"] {
			t.Fatalf("the probe's listing of /dev has no null or zero: %+v", r.Dev)
		}
		// The devices a tier declares it adds are absent elsewhere.
		var added []string
		for _, d := range s.p.Differences {
			if d.ID == "dev-fuse-tun" {
				for _, dev := range d.Devices {
					added = append(added, dev.Name)
				}
			}
		}
		s.expect(t, "dev-fuse-tun", !slices.ContainsFunc(added, func(n string) bool { return present[n] }), "/dev has %s", strings.Join(added, " or "))
		var names []string
		for _, d := range r.Dev {
			names = append(names, d.Name)
			top, _, _ := strings.Cut(d.Name, "/")
			if !slices.Contains(dev.Names, top) {
				t.Errorf("/dev/%s (%s) exists, want a minimal /dev", d.Name, d.Type)
			}
			switch {
			case d.Type == "block":
				t.Errorf("/dev/%s is a block device (%d:%d)", d.Name, d.Major, d.Minor)
			case d.Type == "char" && !dev.Allows(d.Major, d.Minor):
				t.Errorf("/dev/%s is character device %d:%d, not one of the minimal set", d.Name, d.Major, d.Minor)
			}
		}
		t.Logf("/dev: %s", strings.Join(names, " "))
	})

	t.Run("NoHostMounts", func(t *testing.T) {
		points := map[string]bool{}
		for _, m := range r.Mounts {
			points[m.MountPoint] = true
		}
		if !points["/"] || !points["/tmp"] {
			t.Fatalf("the probe's mount table has no / or /tmp: %+v", r.Mounts)
		}
		for _, m := range r.Mounts {
			if !allowedMount(s.p, s.on, m.MountPoint, m.Options) {
				t.Errorf("unexpected mount at %s (%s from %s, %s): only the image, the guest and the profile's mounts may be mounted", m.MountPoint, m.FSType, m.Source, m.Options)
			}
		}
		// The host's files declared mounted here: each is, and the
		// sandbox's user can write none, by its path or another.
		for _, f := range hostFiles {
			s.expect(t, f.id, !points[f.Path], "%s is a mount", f.Path)
		}
		seen, problems := hostFileWrites(hostFiles, func(path string) errno { return writeOp(t, path, "open_write") })
		for _, p := range problems {
			t.Error(p)
		}
		if len(seen) > 0 {
			t.Logf("the host's files declared mounted, opened for writing: %s", strings.Join(seen, ", "))
		}
	})

	for _, c := range []struct{ id, name string }{{"docker-etc-files", "DockerEtcFiles"}, {"kubelet-files", "KubeletFiles"}} {
		d, ok := s.difference(c.id)
		if !ok {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			// The machine the suite runs on is the node (docker's host,
			// the one-node cluster's node).
			node, _ := os.Hostname()
			for _, f := range d.Files {
				if len(f.Lines) == 0 {
					continue
				}
				var rd struct {
					errno
					Content string `json:"content"`
				}
				decode(t, b.run(t, sandbox.ExecRequest{}, "readfile", f.Path), &rd, "readfile")
				for _, p := range fileProblems(f, rd.Content, s.p.Hostname, node) {
					t.Errorf("%s: %s, in %q: want the driver's fixed contents and nothing of the host's", f.Path, p, rd.Content)
				}
			}
		})
	}
}

// hostFile is a file of the host's a declared difference (id) mounts.
type hostFile struct {
	profile.File
	id string
}

// hostFiles returns the host's files the differences declared for the
// suite's sandboxes mount into them.
func (s *suite) hostFiles() []hostFile {
	var out []hostFile
	for _, d := range s.p.Differences {
		if d.Applies(s.on) {
			for _, f := range d.Files {
				out = append(out, hostFile{f, d.ID})
			}
		}
	}
	return out
}

// hostFileWrites reads, from opened (the probe's errno for opening a path
// for writing), each of files opened by its path and through
// /proc/self/root: what it saw, and a problem for each that did not fail
// with EACCES or EROFS.
func hostFileWrites(files []hostFile, opened func(path string) errno) (seen, problems []string) {
	for _, f := range files {
		for _, p := range []string{f.Path, "/proc/self/root" + f.Path} {
			e := opened(p)
			seen = append(seen, p+" "+e.String())
			if !e.is(syscall.EACCES) && !e.is(syscall.EROFS) {
				problems = append(problems, fmt.Sprintf("opening the host's file %s for writing: got %s, want EACCES or EROFS", p, e))
			}
		}
	}
	return seen, problems
}

// allowedMount reports whether profile p accounts for a mount at point,
// mounted with options, on a sandbox on: the image's root, a scratch, the
// guest agent, the kernel file systems and what is below them, and the
// host's files declared mounted there (Difference.Files), read-only unless
// declared writable. The suite's sandboxes have no data mounts and no
// egress.
func allowedMount(p profile.Profile, on profile.On, point, options string) bool {
	if _, ok := p.ScratchAt(point); ok || point == "/" || point == p.Guest.Path {
		return true
	}
	for _, m := range p.Mounts {
		if under(point, m.Path) {
			return true
		}
	}
	for _, d := range p.Differences {
		if d.Applies(on) && slices.ContainsFunc(d.Files, func(f profile.File) bool {
			return f.Path == point && (f.Writable || hasOption(options, "ro"))
		}) {
			return true
		}
	}
	return false
}

// under reports whether p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

func hasOption(opts, o string) bool {
	for _, v := range strings.Split(opts, ",") {
		if v == o {
			return true
		}
	}
	return false
}

// fileProblems says how content, a host's file f the runtime mounts into
// the sandbox, differs from what the profile declares: each of f's Lines
// a whole line of it, a line ending with f.Host, with Exact no other line
// but f.May's, comments and lines ending with the sandbox's host name
// (sandboxHost); in any case no search line and nothing naming the node
// (nodeHost, "" for unknown).
func fileProblems(f profile.File, content, sandboxHost, nodeHost string) []string {
	norm := func(l string) string { return strings.Join(strings.Fields(l), " ") }
	lines := map[string]bool{}
	var out []string
	hostLine := false
	for _, l := range strings.Split(content, "\n") {
		l = norm(l)
		if l == "" {
			continue
		}
		lines[l] = true
		fields := strings.Fields(l)
		last := fields[len(fields)-1]
		if f.Host != "" && !strings.HasPrefix(l, "#") && len(fields) > 1 && last == f.Host {
			hostLine = true
		}
		switch {
		case fields[0] == "search":
			out = append(out, fmt.Sprintf("a search line %q", l))
		case nodeHost != "" && nodeHost != sandboxHost && nodeHost != "localhost" && slices.ContainsFunc(fields, func(x string) bool {
			return strings.EqualFold(x, nodeHost) || strings.HasPrefix(strings.ToLower(x), strings.ToLower(nodeHost)+".")
		}):
			out = append(out, fmt.Sprintf("the node's host name %s in %q", nodeHost, l))
		case f.Exact && !strings.HasPrefix(l, "#") && !slices.ContainsFunc(f.Lines, func(x string) bool { return norm(x) == l }) &&
			!slices.ContainsFunc(f.May, func(x string) bool { return norm(x) == l }) && last != sandboxHost:
			out = append(out, fmt.Sprintf("a line %q the runtime does not write", l))
		}
	}
	for _, want := range f.Lines {
		if !lines[norm(want)] {
			out = append(out, fmt.Sprintf("no line %q", want))
		}
	}
	if f.Host != "" && !hostLine {
		out = append(out, fmt.Sprintf("no line naming the host %s", f.Host))
	}
	return out
}
