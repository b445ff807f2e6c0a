package main

import (
	"bytes"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// This file holds the filesystem subcommand, fs.

// fsProbe tries to write where the profile forbids it, fills /tmp, and
// reports mount flags, /dev and the mount table. It also opens each of
// files for writing, by its path and through /proc/self/root.
func fsProbe(files []string) obj {
	var writes []obj
	try := func(path, op string, err error) {
		o := obj{{"path", path}, {"op", op}}
		writes = append(writes, append(o, attempt(err)...))
	}
	create := func(p string) {
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
			unix.Unlink(p)
		}
		try(p, "create", err)
	}
	// openWrite opens an existing file for writing without truncating it
	// and writes nothing: success alone is the finding.
	openWrite := func(p string) {
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		try(p, "open_write", err)
	}
	mkdir := func(p string) {
		err := unix.Mkdir(p, 0o755)
		if err == nil {
			unix.Rmdir(p)
		}
		try(p, "mkdir", err)
	}
	for _, p := range []string{
		"/.stockade-probe", "/etc/.stockade-probe", "/usr/bin/.stockade-probe",
		"/.stockade/.stockade-probe", "/var/tmp/.stockade-probe",
		"/tmp/.stockade-probe", "/dev/.stockade-probe", "/dev/shm/.stockade-probe",
	} {
		create(p)
	}
	mkdir("/.stockade-probe-dir")
	mkdir("/usr/.stockade-probe-dir")
	// A device node (1:3, null) where nodev should make it useless, and a
	// FIFO, which needs no privilege, to show that mknod reaches /tmp.
	mknod := func(p string, mode uint32, dev int) {
		err := unix.Mknod(p, mode, dev)
		if err == nil {
			unix.Unlink(p)
		}
		try(p, "mknod", err)
	}
	mknod("/tmp/.stockade-probe-dev", unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3)))
	mknod("/tmp/.stockade-probe-fifo", unix.S_IFIFO|0o600, 0)
	for _, p := range []string{
		"/.stockade/guest", "/etc/passwd", "/bin/busybox",
		"/proc/sysrq-trigger", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/uevent_helper",
		// The process's own comm is writable by it: the control that an
		// open for writing in /proc can succeed.
		"/proc/self/comm",
	} {
		openWrite(p)
	}
	for _, p := range files {
		openWrite(p)
		openWrite("/proc/self/root" + p)
	}
	try("/tmp", "chmod", unix.Chmod("/tmp", 0o777))
	// A set-uid, set-gid file of the probe's own in /tmp, given to root:
	// without CAP_CHOWN refused, while giving it to its owner (a no-op)
	// shows that chown reaches it.
	own := "/tmp/.stockade-probe-suid"
	if fd, err := unix.Open(own, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o755); err != nil {
		try(own, "create", err)
	} else {
		unix.Close(fd)
		try(own, "chmod_suid", unix.Chmod(own, 0o6755))
		try(own, "chown_self", unix.Chown(own, unix.Getuid(), unix.Getgid()))
		try(own, "chown_root", unix.Chown(own, 0, 0))
		unix.Unlink(own)
	}

	var mounts []obj
	for _, p := range []string{"/", "/etc", "/usr/bin", "/.stockade/guest", "/tmp", "/proc", "/proc/sys", "/sys", "/dev", "/dev/shm"} {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		o := obj{
			{"path", p}, {"flags", int64(st.Flags)},
			{"ro", st.Flags&unix.ST_RDONLY != 0}, {"nosuid", st.Flags&unix.ST_NOSUID != 0},
			{"nodev", st.Flags&unix.ST_NODEV != 0}, {"noexec", st.Flags&unix.ST_NOEXEC != 0},
			{"size", int64(st.Blocks) * st.Bsize}, {"type", "0x" + strconv.FormatInt(st.Type, 16)},
		}
		mounts = append(mounts, append(o, attempt(err)...))
	}

	return obj{
		{"writes", writes},
		{"proc_sys", procSysWrites()},
		{"statfs", mounts},
		{"tmp_fill", fillTmp()},
		{"dev", devEntries()},
		{"mounts", mountinfo()},
	}
}

// procSysWrites opens every regular file below /proc/sys for writing
// (without truncating, writing nothing: success alone is the finding) and
// reports how many it tried, which opened and the errnos of the others.
func procSysWrites() obj {
	tried := 0
	writable := []string{}
	errnos := map[string]int{}
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		for _, name := range listDir(dir) {
			p := dir + "/" + name
			var st unix.Stat_t
			if unix.Lstat(p, &st) != nil {
				continue
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				if depth < 8 {
					walk(p, depth+1)
				}
			case unix.S_IFREG:
				tried++
				fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
				if err == nil {
					unix.Close(fd)
					writable = append(writable, p)
				} else {
					errnos[unix.ErrnoName(errnoOf(err))]++
				}
			}
		}
	}
	walk("/proc/sys", 0)
	names := make([]string, 0, len(errnos))
	for k := range errnos {
		names = append(names, k)
	}
	sort.Strings(names)
	counts := obj{}
	for _, k := range names {
		counts = append(counts, field{k, errnos[k]})
	}
	return obj{{"tried", tried}, {"writable", writable}, {"errnos", counts}}
}

// fillTmp writes to a file in /tmp until the write fails (at most 4 GiB),
// reports how much was written and why it stopped, and removes the file.
func fillTmp() obj {
	const path = "/tmp/.stockade-probe-fill"
	var written int64
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err == nil {
		buf := bytes.Repeat([]byte{'f'}, 64<<10)
		for written < 4<<30 {
			var n int
			n, err = unix.Write(fd, buf)
			if err == unix.EINTR {
				continue
			}
			if n > 0 {
				written += int64(n)
			}
			if err != nil {
				break
			}
			if n == 0 {
				err = unix.EIO
				break
			}
		}
		unix.Close(fd)
		unix.Unlink(path)
	}
	return append(obj{{"written", written}}, attempt(err)...)
}

// devEntries lists /dev and one level below it, with each node's type and
// device number.
func devEntries() []obj {
	var out []obj
	var walk func(dir, prefix string, depth int)
	walk = func(dir, prefix string, depth int) {
		for _, name := range listDir(dir) {
			p := dir + "/" + name
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				out = append(out, append(obj{{"name", prefix + name}, {"type", "unknown"}}, attempt(err)...))
				continue
			}
			typ := "other"
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFCHR:
				typ = "char"
			case unix.S_IFBLK:
				typ = "block"
			case unix.S_IFDIR:
				typ = "dir"
			case unix.S_IFLNK:
				typ = "symlink"
			case unix.S_IFREG:
				typ = "file"
			case unix.S_IFSOCK:
				typ = "socket"
			case unix.S_IFIFO:
				typ = "fifo"
			}
			o := obj{{"name", prefix + name}, {"type", typ}}
			if typ == "char" || typ == "block" {
				o = append(o, field{"major", int(unix.Major(st.Rdev))}, field{"minor", int(unix.Minor(st.Rdev))})
			}
			out = append(out, o)
			if typ == "dir" && depth == 0 {
				walk(p, prefix+name+"/", 1)
			}
		}
	}
	walk("/dev", "", 0)
	return out
}

// mountinfo parses /proc/self/mountinfo.
func mountinfo() []obj {
	var out []obj
	b, _ := readLimited("/proc/self/mountinfo", 1<<20)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		sep := -1
		for i, s := range f {
			if s == "-" {
				sep = i
				break
			}
		}
		if len(f) < 6 || sep < 0 || sep+3 > len(f) {
			continue
		}
		out = append(out, obj{
			{"mount_point", unescape(f[4])}, {"root", unescape(f[3])}, {"options", f[5]},
			{"fstype", f[sep+1]}, {"source", unescape(f[sep+2])}, {"super_options", strings.Join(f[sep+3:], " ")},
		})
	}
	return out
}

// unescape undoes mountinfo's octal escapes (\040 for space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
