package api

import (
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// LimitListener returns a listener that keeps at most max of ln's
// connections open at once. A connection accepted beyond the cap is closed
// at once, before a byte of it is read, and counted in m (which may be
// nil): refusing costs an accept and a close, so that clients over the cap
// tie up nothing. An HTTP answer such as 503 would cost more than it
// tells: its request must be read first, and a client that does not read
// holds the connection while the answer is written. A connection's slot is
// freed when the server closes it, whatever ends it.
func LimitListener(ln net.Listener, max int, m *Metrics) net.Listener {
	return &limitListener{Listener: ln, max: int64(max), m: m}
}

type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64
	m    *Metrics
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			_ = c.Close()
			l.m.connectionRefused()
			continue
		}
		l.m.connectionOpened(1)
		return &limitedConn{Conn: c, l: l}, nil
	}
}

// limitedConn frees its slot of the listener's cap when it is first closed.
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.m.connectionOpened(-1)
	})
	return err
}

// CloseWrite half-closes a TCP connection: net/http does so before it
// closes a connection whose request body it did not read, so that the
// client receives the answer rather than a reset.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// discardGrace is how long the server waits for a request body it answers
// without reading (no valid key, no route, a body it refused) before it
// closes the connection: long enough to take a body already on its way, so
// that the client reads the answer instead of a reset, and short enough
// that a body that never comes does not hold the connection.
const discardGrace = time.Second

// deadlines bounds each request's reading and writing on the connection.
// A request body must arrive within BodyTimeout of the headers; the
// deadline is lifted when the body has been read to its end, so that it
// does not cut what the handler waits for afterwards (a long poll, an event
// stream), during which the server reads the connection to notice a client
// that went away. Each write of the answer must be taken by the client
// within WriteTimeout: the deadline moves with every write, so that a
// client that stops reading is cut off while a stream that writes now and
// then is not.
func (s *server) deadlines(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.ContentLength != 0 {
			_ = rc.SetReadDeadline(time.Now().Add(s.opts.BodyTimeout))
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
		}
		next.ServeHTTP(&deadlineWriter{ResponseWriter: w, rc: rc, timeout: s.opts.WriteTimeout}, r)
	})
}

// closeWithoutBody prepares an answer given without reading the request
// body: the connection closes after the answer, and the server waits at
// most discardGrace for the body it discards, so that a client announcing
// a body it never sends cannot hold the connection.
func (s *server) closeWithoutBody(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	if r.ContentLength != 0 {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(min(s.opts.BodyTimeout, discardGrace)))
	}
}

// deadlineBody lifts the read deadline once the body has been read to its
// end.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// deadlineWriter moves the connection's write deadline before each write.
// It unwraps for http.ResponseController and flushes for event streams.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (w *deadlineWriter) extend() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout)) }

func (w *deadlineWriter) WriteHeader(code int) {
	w.extend()
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.extend()
	return w.ResponseWriter.Write(p)
}

func (w *deadlineWriter) Flush() {
	w.extend()
	_ = w.rc.Flush()
}

func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
