// Command probe is the in-sandbox half of the driver conformance suite
// (package conformance). It is delivered into a sandbox exactly like user
// code and run as `probe SUBCOMMAND [ARG...]`; each subcommand tries what
// hostile code would try and prints one JSON object on stdout describing
// what it observed. It never judges: the suite on the host asserts.
//
// It must be built static (CGO_ENABLED=0) so that it runs in any image, and
// it must never crash on a refusal: every failed attempt is reported as an
// errno (0 meaning the attempt succeeded).
//
//	caps                 capability sets, no_new_privs, seccomp mode, ids
//	fs [FILE...]         writes to the image, /tmp and /proc/sys (and each
//	                     FILE, also through /proc/self/root), mknod and
//	                     chown in /tmp, /tmp filled to ENOSPC,
//	                     mount flags, /dev entries, mounts
//	net ADDR...          interfaces, a TCP connect to each host:port and to
//	                     its own loopback, ICMP sockets, low and free ports
//	env [CANARY_HEX]     the environment, and every readable /proc/*/environ
//	                     and /proc/*/cmdline scanned for the canary
//	pids                 visible processes
//	syscalls             system calls the profile must refuse: the errno of
//	                     each attempt and the filter's verdict on it
//	forkbomb [MAX [HOLD_MS]]  fork until refused, hold, kill the children
//	alloc MIB            allocate and touch MIB mebibytes
//	spin | sleep SECONDS [TAG]  print "started", then busy-loop or sleep
//	busy N SECONDS MARKER  start N processes busy-looping for SECONDS
//	                     (MARKER in their argv), print "started", wait
//	                     for them, then print the wall time and their CPU
//	                     time as the sandbox's kernel counts it
//	daemon MARKER [HOLD] double-fork a setsid daemon sleeping 300 s with
//	                     MARKER in its argv, print its pid and the pids
//	                     findproc sees, then exit 0 (or print "started"
//	                     and sleep HOLD seconds first)
//	findproc MARKER      the other processes with MARKER in their argv
//	flood BYTES [stdout|stderr|both]  write BYTES of output
//	writefile PATH [CONTENT] | readfile PATH
//	mark PATH SECONDS    write PATH, print "started", sleep
//	seeothers            list /tmp and the visible processes
//	exit CODE | stdin    exit with CODE | echo stdin
//	reach HOST:PORT      the blast-radius survey (see reach.go): environment
//	                     names, privileges, namespaces, mounts, a walk of the
//	                     filesystem, /dev, unix sockets, outbound attempts
//	                     (TCP to HOST:PORT and to the metadata address, DNS),
//	                     visible limits; only ever inside a sandbox, as its
//	                     attempts would leave a host
//	pidlimit MAX [PACE_US]  the sandbox's tasks, then fork sleeping children
//	                     until refused (PACE_US apart, default 0), with
//	                     "forked N" on stderr after each
//	fds                  the open descriptors and what each is, but the
//	                     one the listing reads
//	killparent           send the parent (the guest) every signal but
//	                     SIGKILL, SIGSTOP and the synchronous faults
package main

import (
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe SUBCOMMAND [ARG...]")
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "caps":
		emit(caps())
	case "fs":
		emit(fsProbe(args))
	case "net":
		emit(netProbe(args))
	case "env":
		emit(envProbe(args))
	case "pids":
		emit(obj{{"self", os.Getpid()}, {"procs", procs()}})
	case "syscalls":
		emit(syscallsProbe())
	case "forkbomb":
		max, hold := 1024, int64(2000)
		if len(args) > 0 {
			max = atoi(args[0])
		}
		if len(args) > 1 {
			hold = int64(atoi(args[1]))
		}
		emit(forkbomb(max, hold))
	case "alloc":
		emit(alloc(atoi(arg(args, 0, "MIB"))))
	case "spin":
		writeAll(1, []byte("started\n"))
		for {
		}
	case "sleep":
		sleep(args)
	case "busy":
		emit(busy(atoi(arg(args, 0, "N")), atoi(arg(args, 1, "SECONDS")), arg(args, 2, "MARKER")))
	case "busy-one":
		end := time.Now().Add(time.Duration(atoi(arg(args, 0, "SECONDS"))) * time.Second)
		for time.Now().Before(end) {
		}
	case "daemon":
		emit(daemon(arg(args, 0, "MARKER")))
		if len(args) > 1 {
			// Stay running, so that the daemon is alive while the Exec is.
			writeAll(1, []byte("started\n"))
			time.Sleep(time.Duration(atoi(args[1])) * time.Second)
		}
	case "daemon-mid":
		daemonMid(arg(args, 0, "MARKER"))
	case "findproc":
		emit(obj{{"pids", findProcs(arg(args, 0, "MARKER"))}})
	case "fds":
		emit(obj{{"fds", openFDs()}})
	case "flood":
		stream := "stdout"
		if len(args) > 1 {
			stream = args[1]
		}
		flood(atoi(arg(args, 0, "BYTES")), stream)
	case "writefile":
		content := "stockade-probe"
		if len(args) > 1 {
			content = args[1]
		}
		p := arg(args, 0, "PATH")
		o := obj{{"path", p}}
		emit(append(o, attempt(os.WriteFile(p, []byte(content), 0o644))...))
	case "readfile":
		p := arg(args, 0, "PATH")
		b, err := readLimited(p, 64<<10)
		o := obj{{"path", p}}
		o = append(o, attempt(err)...)
		emit(append(o, field{"content", string(b)}))
	case "mark":
		p := arg(args, 0, "PATH")
		if err := os.WriteFile(p, []byte("mark"), 0o644); err != nil {
			fail("writing " + p + ": " + err.Error())
		}
		writeAll(1, []byte("started\n"))
		time.Sleep(time.Duration(atoi(arg(args, 1, "SECONDS"))) * time.Second)
		emit(obj{{"path", p}})
	case "seeothers":
		emit(obj{{"self", os.Getpid()}, {"tmp", listDir("/tmp")}, {"procs", procs()}})
	case "exit":
		code := atoi(arg(args, 0, "CODE"))
		emit(obj{{"exit", code}})
		os.Exit(code)
	case "stdin":
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 4<<20))
		o := obj{{"stdin", string(b)}, {"bytes", len(b)}}
		emit(append(o, attempt(err)...))
	case "reach":
		emit(reach(arg(args, 0, "HOST:PORT")))
	case "pidlimit":
		pace := int64(0)
		if len(args) > 1 {
			pace = int64(atoi(args[1]))
		}
		emit(pidlimit(atoi(arg(args, 0, "MAX")), pace))
	case "killparent":
		emit(killParent())
	default:
		fail("unknown subcommand " + strconv.Quote(os.Args[1]))
	}
}

func arg(args []string, i int, name string) string {
	if i >= len(args) {
		fail("missing argument " + name)
	}
	return args[i]
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fail("bad number " + strconv.Quote(s))
	}
	return n
}

// readLimited reads at most max bytes of path.
func readLimited(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}

func readTrim(path string) string {
	b, _ := readLimited(path, 64<<10)
	return strings.TrimSpace(string(b))
}

func listDir(dir string) []string {
	ents, err := os.ReadDir(dir)
	names := []string{}
	if err != nil {
		return names
	}
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// statusFields parses a /proc/PID/status file into key -> value.
func statusFields(path string) map[string]string {
	m := map[string]string{}
	b, _ := readLimited(path, 64<<10)
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func hex64(v uint64) string {
	s := strconv.FormatUint(v, 16)
	return strings.Repeat("0", 16-len(s)) + s
}
