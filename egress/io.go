package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// idleConn sets a fresh deadline before every read and write, so that a
// connection on which nothing moves is closed after idle. During the header
// phase, until caps read deadlines at an absolute time.
type idleConn struct {
	net.Conn
	idle  time.Duration
	until time.Time // read-side only; zero means none
}

func (c *idleConn) Read(p []byte) (int, error) {
	dl := time.Now().Add(c.idle)
	if !c.until.IsZero() && c.until.Before(dl) {
		dl = c.until
	}
	_ = c.Conn.SetReadDeadline(dl)
	return c.Conn.Read(p)
}

func (c *idleConn) Write(p []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	return c.Conn.Write(p)
}

// limitReader fails reads once n bytes have been read, instead of
// reporting EOF as io.LimitedReader does, so that an oversized header is an
// error rather than a truncated request.
type limitReader struct {
	r io.Reader
	n int64
}

var errTooLarge = errors.New("size limit reached")

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// activity is the time of the last byte moved on a connection, in either
// direction. A direction whose read times out carries on while the other
// direction is busy: a long download sends nothing upstream.
type activity struct{ at atomic.Int64 }

func (a *activity) touch() {
	if a != nil {
		a.at.Store(time.Now().UnixNano())
	}
}
func (a *activity) within(d time.Duration) bool { return time.Since(time.Unix(0, a.at.Load())) < d }

// copyBounded copies src to dst until EOF (nil error), an error, or max
// bytes (errTooLarge). A read timeout ends the copy unless act saw bytes
// within idle.
func copyBounded(dst io.Writer, src io.Reader, max int64, act *activity, idle time.Duration) (int64, error) {
	buf := make([]byte, 64<<10)
	var n int64
	for {
		k, rerr := src.Read(buf)
		if k > 0 {
			if n+int64(k) > max {
				k = int(max - n)
				w, _ := dst.Write(buf[:k])
				return n + int64(w), errTooLarge
			}
			act.touch()
			w, werr := dst.Write(buf[:k])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				return n, nil
			}
			var ne net.Error
			if errors.As(rerr, &ne) && ne.Timeout() && act != nil && act.within(idle) {
				continue
			}
			return n, rerr
		}
	}
}

// closeWrite half-closes a TCP connection: the peer reads EOF but may
// still send.
func closeWrite(c net.Conn) {
	if ic, ok := c.(*idleConn); ok {
		c = ic.Conn
	}
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
}

// splice copies both ways between the client (read through cr, which holds
// bytes already buffered) and the upstream until both directions end. An
// error in either direction closes both connections.
func splice(client *idleConn, cr io.Reader, up *idleConn, max int64, idle time.Duration) (upN, downN int64) {
	act := &activity{}
	act.touch()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var err error
		downN, err = copyBounded(client, up, max, act, idle)
		if err != nil {
			client.Conn.Close()
			up.Conn.Close()
			return
		}
		closeWrite(client)
	}()
	upN, err := copyBounded(up, cr, max, act, idle)
	if err != nil {
		client.Conn.Close()
		up.Conn.Close()
	} else {
		closeWrite(up)
	}
	<-done
	return upN, downN
}

// readClientHello reads one TLS ClientHello from r and returns its server
// name and the bytes read, which the caller forwards upstream unchanged. The
// parsing is crypto/tls's own: a server handshake runs on a connection that
// can only be read, and stops right after the ClientHello. No byte is ever
// written to the client.
func readClientHello(r io.Reader) (string, []byte, error) {
	var raw bytes.Buffer
	var sni string
	var seen bool
	errStop := errors.New("stop after ClientHello")
	err := tls.Server(readOnlyConn{r: io.TeeReader(r, &raw)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, seen = h.ServerName, true
			return nil, errStop
		},
	}).Handshake()
	if !seen {
		if err == nil {
			err = errors.New("no ClientHello")
		}
		return "", raw.Bytes(), err
	}
	return sni, raw.Bytes(), nil
}

// readOnlyConn is the net.Conn readClientHello hands crypto/tls: reads come
// from r, writes (the alert crypto/tls sends when it is stopped) vanish.
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c readOnlyConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c readOnlyConn) Close() error                     { return nil }
func (c readOnlyConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c readOnlyConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (c readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (c readOnlyConn) SetWriteDeadline(time.Time) error { return nil }

// bufferedResponse is the http.ResponseWriter the broker writes into; its
// body is bounded by max.
type bufferedResponse struct {
	header http.Header
	code   int
	buf    bytes.Buffer
	max    int
	over   bool
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	if b.buf.Len()+len(p) > b.max {
		b.over = true
		return 0, errTooLarge
	}
	return b.buf.Write(p)
}
