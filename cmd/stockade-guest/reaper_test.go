package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// TestProcessStopped classifies lines of /proc/<pid>/stat as allStopped
// reads them: a stopped process of one thread is stopped without reading
// its tasks, one of several threads or a zombie needs its tasks read, and
// one whose main thread runs is not stopped.
func TestProcessStopped(t *testing.T) {
	for _, c := range []struct {
		name, line string
		want       int
	}{
		{"stopped alone", "12 (python3) T 1 12 12 0 -1 4194560 900 0 0 0 5 3 0 0 20 0 1 0 81 1000 100", stopped},
		{"traced alone", "12 (python3) t 1 12 12 0 -1 4194560 900 0 0 0 5 3 0 0 20 0 1 0 81 1000 100", stopped},
		{"stopped, three threads", "12 (python3) T 1 12 12 0 -1 4194560 900 0 0 0 5 3 0 0 20 0 3 0 81 1000 100", readTheTasks},
		{"zombie main thread", "12 (python3) Z 1 12 12 0 -1 4194560 900 0 0 0 5 3 0 0 20 0 1 0 81 1000 100", readTheTasks},
		{"sleeping", "12 (python3) S 1 12 12 0 -1 4194560 900 0 0 0 5 3 0 0 20 0 1 0 81 1000 100", notStopped},
		{"running", "12 (python3) R 1 12 12 0 -1 4194560 900 0 0 0 5 3 0 0 20 0 1 0 81 1000 100", notStopped},
		// The command name may hold anything up to the last ')'.
		{"name with ') T '", "12 (a) T 1 (b) S 1 12 12 0 -1 4194560 900 0 0 0 5 3 0 0 20 0 1 0 81", notStopped},
		{"cut short", "12 (python3) T 1 12 12", readTheTasks},
		{"no state", "12 (python3)", notStopped},
		// The shape of gVisor's line (fsimpl/proc's taskStatData), its
		// tail cut: the fields it leaves 0 are still there.
		{"gVisor stopped alone", "2 (python3) T 1 2 2 0 0 0 0 0 0 0 3 1 0 0 20 0 1 0 4 52428800 3200 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0", stopped},
	} {
		if got := processStopped([]byte(c.line)); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}

// TestProcessStoppedOnThisKernel reads the lines of real processes: a
// stopped sleep (one thread), a stopped python with a second thread, and
// this test's own (running, several threads).
func TestProcessStoppedOnThisKernel(t *testing.T) {
	stat := func(pid int) []byte {
		t.Helper()
		b, err := readProc("/proc/"+strconv.Itoa(pid)+"/stat", make([]byte, 512))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// stop starts argv, waits until it has threads threads, stops it and
	// waits until /proc shows it stopped.
	stop := func(threads int, argv ...string) int {
		t.Helper()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		pid := cmd.Process.Pid
		deadline := time.Now().Add(10 * time.Second)
		for {
			tasks, _ := dirNames("/proc/" + strconv.Itoa(pid) + "/task")
			if len(tasks) == threads {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d threads, want %d", argv[0], len(tasks), threads)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		for deadline = time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if f := statFields(stat(pid)); len(f) > 0 && string(f[0]) == "T" {
				return pid
			}
		}
		t.Fatalf("%s did not stop", argv[0])
		return 0
	}
	if got := processStopped(stat(stop(1, "sleep", "100"))); got != stopped {
		t.Errorf("a stopped sleep: got %d, want stopped (%d)", got, stopped)
	}
	if _, err := exec.LookPath("python3"); err != nil {
		requires(t, "python3")
	}
	py := stop(2, "python3", "-c", "import threading, time; threading.Thread(target=time.sleep, args=(100,)).start(); time.sleep(100)")
	if got := processStopped(stat(py)); got != readTheTasks {
		t.Errorf("a stopped python of two threads: got %d, want its tasks read (%d)", got, readTheTasks)
	}
	if got := processStopped(stat(os.Getpid())); got != notStopped {
		t.Errorf("this test's process: got %d, want not stopped (%d)", got, notStopped)
	}
}

// TestReadProcLine reads /proc files as the stop's scans do: a stat line
// read to its newline is the whole line (as many fields as the file read
// to its end), even where the command name holds a newline and whatever
// the buffer given; and /proc is listed with this process in it.
func TestReadProcLine(t *testing.T) {
	// A name with newlines and a ") T " in it (PR_SET_NAME), on a thread
	// of its own, so that the test's other threads keep theirs.
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // ended with the goroutine: the thread goes
		name := []byte("a\nb) T 1 (c\n\x00")
		if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0); errno != 0 {
			done <- errno
			return
		}
		tid := strconv.Itoa(syscall.Gettid())
		self := "/proc/self/task/" + tid + "/stat"
		// The last size's first read would end at the name's newline.
		for _, size := range []int{512, 64, len(tid + " (a\n")} {
			line, err := readProcLine(self, make([]byte, size))
			if err != nil {
				done <- err
				return
			}
			whole, err := readProc(self, make([]byte, 512))
			if err != nil {
				done <- err
				return
			}
			// The counters move between the reads: the fields are
			// compared by number, and the state read is this thread's.
			if !bytes.Contains(line, []byte("(a\nb) T 1 (c\n) R ")) || !bytes.HasSuffix(line, []byte("\n")) ||
				len(statFields(line)) != len(statFields(whole)) {
				done <- fmt.Errorf("buffer of %d: read %q, the whole file %q", size, line, whole)
				return
			}
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	names, err := procNames()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, strconv.Itoa(os.Getpid())) || slices.Contains(names, ".") {
		t.Fatalf("/proc listed as %q: no %d in it, or a dot entry", names, os.Getpid())
	}
}
