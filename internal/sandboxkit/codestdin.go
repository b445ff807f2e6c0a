package sandboxkit

// A pool's Exec waits for its program on its stdin: the program's first
// write starts the run's CPU count, a warm-up's priming does not.

import (
	"io"
	"sync"
)

// codeStdin is the stdin of an Exec that asks for an exit notice: a warm
// pool's interpreter, started ahead, which waits there for the program it
// is to run. The program begins with the first write, so the cgroup's CPU
// time of the Exec is counted from then (see Guest.CPUFromCgroup).
type codeStdin struct {
	io.WriteCloser
	h    *execHandle
	once sync.Once
}

func (s *codeStdin) Write(p []byte) (int, error) {
	s.h.fed.Store(true)
	s.once.Do(func() { s.h.cpuBefore.Store(int64(s.h.g.Cgroup.CPUUsage())) })
	return s.WriteCloser.Write(p)
}

// Prime writes p, which is not the program (pool.py's warm-up header,
// written as a restored interpreter waits), without starting the run's
// CPU count: the count starts at the program's first Write. It marks
// the interpreter fed as Write does: Freeze lets through only one
// nothing was written to.
func (s *codeStdin) Prime(p []byte) error {
	s.h.fed.Store(true)
	_, err := s.WriteCloser.Write(p)
	return err
}

func (s *codeStdin) Close() error {
	s.h.fed.Store(true)
	return s.WriteCloser.Close()
}

// waiting says whether h is a pool's interpreter that still waits for
// its program: nothing was written to its stdin, nor closed (Freeze).
func (h *execHandle) waiting() bool {
	_, pool := h.stdin.(*codeStdin)
	return pool && !h.fed.Load()
}
