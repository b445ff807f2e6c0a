package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/guest"
)

// The test kernel is a mode of the guest binary (`<guest> stockade-kernel-test`,
// started as a kernel) that speaks the kernel wire, so that the guest's
// kernels can be tested in every sandbox without an interpreter. A cell is
// lines of commands:
//
//	set K V        keep V under K (state that outlives the cell)
//	get K          print the value kept under K, and make it the cell's value
//	print TEXT     print TEXT on stdout; eprint TEXT on stderr
//	stdin          print the cell's stdin
//	display M TEXT a display of MIME type M with TEXT as its data
//	spawn-daemon   start a double-forked daemon (setsid) and print "daemon PID"
//	sleep SECONDS  sleep; SIGINT interrupts it (the cell fails with KeyboardInterrupt)
//	lose-interrupts N  the next N SIGINTs are lost, as a race can lose one
//	fail TEXT      end the cell with an error
//	exit CODE      end the kernel
//	result-exit CODE  send the cell's result, then end the kernel (as a
//	               shell kernel's cell `exit` does)
//
// It is the one mode of the binary that uses os/signal (for SIGINT): the
// guest itself must not, see signals.go.
const testKernelMode = "stockade-kernel-test"

// testDaemonMode is the test kernel's daemon: `<guest> stockade-test-daemon
// fork` starts `... sleep` in its own session, writes its pid to fd 3 and
// exits, so that the sleeper is an orphan of the kernel's tree.
const testDaemonMode = "stockade-test-daemon"

func testKernel() {
	wire := os.NewFile(3, "wire")
	events := os.NewFile(4, "events")
	intr := make(chan os.Signal, 1)
	signal.Notify(intr, syscall.SIGINT)
	// The kernel is the subreaper of its tree: it reaps the daemons'
	// intermediates and orphans.
	go func() {
		for {
			var ws syscall.WaitStatus
			if _, err := syscall.Wait4(-1, &ws, 0, nil); err == syscall.ECHILD {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}()
	emit := func(ev wireEvent) {
		b, _ := json.Marshal(ev)
		events.Write(append(b, '\n'))
	}
	emit(wireEvent{Type: "ready"})
	vars := map[string]string{}
	lose := 0
	sc := bufio.NewScanner(wire)
	sc.Buffer(make([]byte, 64<<10), maxWireLine)
	for sc.Scan() {
		var req wireRequest
		if json.Unmarshal(sc.Bytes(), &req) != nil || req.Type != "cell" {
			continue
		}
		select {
		case <-intr: // an interrupt between cells
		default:
		}
		res := wireEvent{Type: "result", Cell: req.Cell, Status: guest.CellOK}
	lines:
		for _, line := range strings.Split(req.Code, "\n") {
			cmd, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
			switch cmd {
			case "":
			case "set":
				k, v, _ := strings.Cut(arg, " ")
				vars[k] = v
			case "get":
				fmt.Println(vars[arg])
				res.Value = &guest.Display{MimeType: "text/plain", Data: []byte(vars[arg])}
			case "print":
				fmt.Println(arg)
			case "eprint":
				fmt.Fprintln(os.Stderr, arg)
			case "stdin":
				fmt.Print(req.Stdin)
			case "display":
				m, text, _ := strings.Cut(arg, " ")
				emit(wireEvent{Type: "display", Cell: req.Cell, MimeType: m, Data: []byte(text)})
			case "spawn-daemon":
				pid, err := spawnDaemon()
				if err != nil {
					res = failed(req.Cell, "OSError", err.Error())
					break lines
				}
				fmt.Printf("daemon %d\n", pid)
			case "lose-interrupts":
				lose, _ = strconv.Atoi(arg)
			case "sleep":
				d, _ := strconv.ParseFloat(arg, 64)
				wake := time.After(time.Duration(d * float64(time.Second)))
			sleep:
				for {
					select {
					case <-wake:
						break sleep
					case <-intr:
						if lose > 0 {
							lose--
							continue
						}
						res = failed(req.Cell, "KeyboardInterrupt", "")
						break lines
					}
				}
			case "fail":
				res = failed(req.Cell, "TestError", arg)
				break lines
			case "exit":
				code, _ := strconv.Atoi(arg)
				os.Exit(code)
			case "result-exit":
				code, _ := strconv.Atoi(arg)
				emit(res)
				os.Exit(code)
			default:
				res = failed(req.Cell, "SyntaxError", "unknown command "+cmd)
				break lines
			}
		}
		emit(res)
	}
	os.Exit(0)
}

func failed(cell int, name, value string) wireEvent {
	return wireEvent{Type: "result", Cell: cell, Status: guest.CellError, Error: &guest.CellFailure{Name: name, Value: value}}
}

// spawnDaemon starts the daemon's intermediate and returns the pid of the
// daemon it leaves behind.
func spawnDaemon() (int, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer r.Close()
	exe, err := os.Executable()
	if err != nil {
		w.Close()
		return 0, err
	}
	_, err = syscall.ForkExec(exe, []string{exe, testDaemonMode, "fork"}, &syscall.ProcAttr{
		Files: []uintptr{0, 1, 2, w.Fd()},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	w.Close()
	if err != nil {
		return 0, err
	}
	var pid int
	if _, err := fmt.Fscan(r, &pid); err != nil {
		return 0, fmt.Errorf("reading the daemon's pid: %w", err)
	}
	return pid, nil
}

// testDaemon is the daemon's intermediate (fork) or the daemon (sleep).
func testDaemon() {
	if len(os.Args) > 2 && os.Args[2] == "fork" {
		exe, _ := os.Executable()
		pid, err := syscall.ForkExec(exe, []string{exe, testDaemonMode, "sleep"}, &syscall.ProcAttr{Files: []uintptr{0, 1, 2}})
		if err != nil {
			fatalf("test daemon: %v", err)
		}
		fmt.Fprintf(os.NewFile(3, "pid"), "%d\n", pid)
		os.Exit(0)
	}
	time.Sleep(time.Hour)
	os.Exit(0)
}
