package api_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
)

// slow is a client that holds a connection the way an attacker would: it
// sends request, then (with trickle) a byte every 100 ms (a space, which
// may begin a JSON body) until the answer begins, and reads until the
// server closes the connection or its bound passes.
type slow struct {
	request string
	trickle bool
}

// outcome is how a slow connection ended.
type outcome struct {
	// status is the status of the first answer; 0 when none came.
	status int
	// closed says the server closed the connection (end of file or a
	// reset) within the bound; took is when, from the dial.
	closed bool
	took   time.Duration
	err    error
}

func (s slow) run(addr string, within time.Duration) outcome {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return outcome{err: err}
	}
	defer c.Close()
	_ = c.SetReadDeadline(start.Add(within))
	// A refused connection may already be closed: the write's error does
	// not matter, the read tells.
	_, _ = io.WriteString(c, s.request)
	answered := make(chan struct{})
	if s.trickle {
		go func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-answered:
					return
				case <-tick.C:
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		}()
	}
	var o outcome
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if f := strings.Fields(line); err == nil && len(f) >= 2 {
		o.status, _ = strconv.Atoi(f[1])
	}
	close(answered)
	if err == nil {
		_, err = io.Copy(io.Discard, br)
	}
	o.took = time.Since(start)
	o.closed = err == nil || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
	if !o.closed {
		o.err = err
	}
	return o
}

// check fails t unless o is an answer with status (0: none) on a
// connection the server closed within its bound.
func (o outcome) check(t *testing.T, what string, status int, within time.Duration) {
	t.Helper()
	switch {
	case !o.closed:
		t.Errorf("%s: the connection was still open after %s (%v), want it closed by the server", what, within, o.err)
	case o.status != status:
		t.Errorf("%s: got status %d, want %d", what, o.status, status)
	}
}

// post is a POST of /v1/executions announcing a body of 100 bytes, with
// key when it is set.
func post(key string) string {
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	return "POST /v1/executions HTTP/1.1\r\nHost: stockade\r\n" + auth + "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
}

const getOpenAPI = "GET /openapi.json HTTP/1.1\r\nHost: stockade\r\n\r\n"

// serveAPI serves the API of a bare service on loopback as the daemon
// does, with the bounds of o, the idle timeout idle (zero: none) and at
// most max connections.
func serveAPI(t *testing.T, o api.Options, idle time.Duration, max int) (addr, agent string) {
	t.Helper()
	svc, st, agent := newBareService(t)
	ts := httptest.NewUnstartedServer(api.New(svc, st, o))
	ts.Listener = api.LimitListener(ts.Listener, max, o.Metrics)
	ts.Config.IdleTimeout = idle
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String(), agent
}

// TestAnswersWithoutTheBody sends requests that announce a body and never
// send it (or trickle it), to a server whose body timeout is long: those
// it answers without reading the body (no key, no route, a wrong method)
// must be answered and closed at once, not after the timeout, and the rest
// be refused with 408 when the timeout passes.
func TestAnswersWithoutTheBody(t *testing.T) {
	const body = 4 * time.Second
	addr, agent := serveAPI(t, api.Options{BodyTimeout: body}, 0, 100)
	soon := body - time.Second // well before the body timeout
	late := body + 5*time.Second
	tests := []struct {
		name   string
		client slow
		status int
		within time.Duration
	}{
		{"no key, body never sent", slow{request: post("")}, 401, soon},
		{"no key, body trickled", slow{request: post(""), trickle: true}, 401, soon},
		{"no key, no body", slow{request: "GET /v1/workspace HTTP/1.1\r\nHost: stockade\r\n\r\n"}, 401, soon},
		{"no route, body never sent", slow{request: strings.Replace(post(""), "/v1/executions", "/v1/nothing", 1)}, 404, soon},
		{"wrong method, body never sent", slow{request: strings.Replace(post(""), "POST", "PUT", 1)}, 405, soon},
		{"key, body never sent", slow{request: post(agent)}, 408, late},
		{"key, body trickled", slow{request: post(agent), trickle: true}, 408, late},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := tt.client.run(addr, tt.within)
			o.check(t, tt.name, tt.status, tt.within)
			if tt.status == 408 && o.took < body {
				t.Errorf("refused after %s, before the body timeout of %s", o.took, body)
			}
		})
	}
}

// TestBoundsSpareTheWait runs code that takes longer than the body and
// write timeouts, followed three ways: an event stream silent while the
// code sleeps, a long poll of the same execution, and a synchronous POST
// answered when the code ends. No wait may be cut.
func TestBoundsSpareTheWait(t *testing.T) {
	const bound = 500 * time.Millisecond
	e := newEnv(t, backends[0], envConfig{credits: 10, policy: noApproval, api: api.Options{BodyTimeout: bound, WriteTimeout: bound}})
	req := capability.InvokeRequest{Runtime: "shell", Code: "sleep 2; echo done"}
	s := postStream(t, e.url, e.agent, req)
	started := s.next(30 * time.Second)
	var st struct {
		ExecutionID string `json:"execution_id"`
	}
	if err := json.Unmarshal([]byte(started.data), &st); err != nil || started.name != "started" {
		t.Fatalf("first event: got %q %s, want started", started.name, started.data)
	}
	if v := e.wait(st.ExecutionID, 30*time.Second); string(v.Status) != string(model.StatusSucceeded) {
		t.Errorf("long poll: got %s, want succeeded", v.Status)
	}
	if evs := s.rest(30 * time.Second); len(evs) == 0 || evs[len(evs)-1].name != "result" {
		t.Errorf("event stream: got %v, want it to end with the result", evs)
	}
	v := e.invoke(req).want(t, http.StatusOK).execution(t)
	if res := result(t, v); string(v.Status) != string(model.StatusSucceeded) || res.Stdout != "done\n" {
		t.Errorf("synchronous POST: got %s %s, want succeeded with its output", v.Status, v.Result)
	}
}

// TestClientThatDoesNotRead asks for far more than the socket buffers
// hold and never reads: the server must give up on the connection when a
// write has waited the write timeout, rather than hold it forever.
func TestClientThatDoesNotRead(t *testing.T) {
	const write = time.Second
	addr, _ := serveAPI(t, api.Options{WriteTimeout: write}, 0, 10)
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// 400 answers of the 27 kB document, 11 MB: more than the server's
	// send buffer (at most 4 MiB) and the client's receive buffer.
	const n = 400
	if _, err := io.WriteString(c, strings.Repeat(getOpenAPI, n)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(write + 3*time.Second)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.Copy(io.Discard, c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after %d bytes: %v, want the connection closed by the server", got, err)
	}
	if doc := do(t, "http://"+addr, "GET", "/openapi.json", "", nil).want(t, http.StatusOK); got >= int64(n*len(doc.body)) {
		t.Errorf("got %d bytes, all %d answers: the server did not give up on the client", got, n)
	}
}

// TestLimitListener fills the cap and checks that one more connection is
// closed unread and counted, and that a slot comes back when the server
// closes a connection.
func TestLimitListener(t *testing.T) {
	m := api.NewMetrics()
	const idle = time.Second
	addr, _ := serveAPI(t, api.Options{Metrics: m}, idle, 2)
	var held sync.WaitGroup
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// An answer shows the server took the connection.
		if _, err := io.WriteString(c, getOpenAPI); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		held.Add(1)
		go func() { defer held.Done(); _, _ = io.Copy(io.Discard, c) }()
	}
	if o := (slow{request: getOpenAPI}).run(addr, 5*time.Second); !o.closed || o.status != 0 {
		t.Errorf("a third connection: got status %d, closed %v (%v), want closed unanswered", o.status, o.closed, o.err)
	}
	held.Wait() // the idle timeout closes both
	o := (slow{request: strings.Replace(getOpenAPI, "\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1)}).run(addr, 5*time.Second)
	o.check(t, "a connection after the idle ones closed", 200, 5*time.Second)
	wantMetrics(t, m, "stockade_api_connections_refused_total 1", "stockade_api_connections_open 0")
}

// wantMetrics waits up to 5 s for m to show each of lines (see
// pollMetrics).
func wantMetrics(t *testing.T, m *api.Metrics, lines ...string) {
	t.Helper()
	pollMetrics(t, func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}, lines...)
}

// pollMetrics waits up to 5 s for the metrics that fetch returns to show
// each of lines. The connection gauges lag what a client sees: the server
// counts a connection closed just after the client sees it closed, so a
// single read may still count one the client has done with.
func pollMetrics(t *testing.T, fetch func() string, lines ...string) {
	t.Helper()
	var text string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if text = fetch(); allLines(text, lines) {
			return
		}
	}
	t.Errorf("metrics: want %q in\n%s", lines, grepLines(text, "stockade_api_connections"))
}

// allLines reports whether text has each of lines as a line.
func allLines(text string, lines []string) bool {
	for _, l := range lines {
		if !strings.Contains("\n"+text, "\n"+l+"\n") {
			return false
		}
	}
	return true
}

// TestDaemonConnectionsEnd attacks a real daemon, with short bounds, with
// 500 connections without a key or with a key but no body: 300 that fill
// the connection cap (idle after an answer, silent, a body trickled a byte
// every 100 ms or announced and never sent), 100 beyond the cap, then 100
// that announce a body without a key. Each must be closed by the server
// within its bound (and the refused ones unanswered), the daemon's open
// files must come back to where they were, and /metrics must count the
// refusals.
func TestDaemonConnectionsEnd(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	bin := testenv.Build(t, "./cmd/stockade")
	dir := t.TempDir()
	db := filepath.Join(dir, "stockade.db")
	key, args := setUpDaemon(t, bin, dir, "sqlite:"+db, filepath.Join(dir, "state"))
	const (
		bound = 5 * time.Second // idle, header and body timeouts
		held  = 300             // the connection cap
		slack = 5 * time.Second
	)
	d := startDaemon(t, bin, append(args, "--idle-timeout", bound.String(), "--header-timeout", bound.String(),
		"--body-timeout", bound.String(), "--max-connections", strconv.Itoa(held))...)
	addr := strings.TrimPrefix(d.url, "http://")
	http.DefaultClient.CloseIdleConnections()
	// The daemon's open files but the database's: the store's pool of
	// SQLite connections (up to 4 readers, two files each) grows with
	// concurrent requests, as many as overlapped, and keeps them.
	openFiles := func() int {
		pid := d.cmd.Process.Pid
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, fd := range fds {
			if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); !strings.HasPrefix(target, db) {
				n++
			}
		}
		return n
	}
	oneShot := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: requestTimeout}
	time.Sleep(500 * time.Millisecond) // the server closes the connection of the start-up check
	base := openFiles()

	type group struct {
		name   string
		n      int
		client slow
		status int
		within time.Duration
	}
	// attack starts the groups' connections at once; wait returns their
	// outcomes by group once all have ended.
	attack := func(groups []group) (wait func() [][]outcome) {
		out := make([][]outcome, len(groups))
		var wg sync.WaitGroup
		for i, g := range groups {
			out[i] = make([]outcome, g.n)
			for j := range g.n {
				wg.Go(func() { out[i][j] = g.client.run(addr, g.within) })
			}
		}
		return func() [][]outcome { wg.Wait(); return out }
	}
	check := func(groups []group, outs [][]outcome) {
		t.Helper()
		for i, g := range groups {
			var slowest time.Duration
			failed := 0
			for _, o := range outs[i] {
				slowest = max(slowest, o.took)
				if failed < 3 && (!o.closed || o.status != g.status) {
					failed++
					o.check(t, g.name, g.status, g.within)
				}
			}
			t.Logf("%d %s: the last closed after %s", g.n, g.name, slowest.Round(10*time.Millisecond))
		}
	}

	filling := []group{
		{"idle after an answer, no key", held / 4, slow{request: getOpenAPI}, 200, bound + slack},
		{"silent, no key", held / 4, slow{}, 0, bound + slack},
		{"body trickled, with a key", held / 4, slow{request: post(key), trickle: true}, 408, bound + slack},
		{"body never sent, with a key", held / 4, slow{request: post(key)}, 408, bound + slack},
	}
	filled := attack(filling)
	peak := base
	for deadline := time.Now().Add(bound / 2); peak < base+held && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		peak = max(peak, openFiles())
	}
	if peak < base+held {
		t.Fatalf("open files while %d connections are held: got %d, want %d more than the %d before", held, peak, held, base)
	}
	beyond := []group{{"beyond the cap", 100, slow{request: getOpenAPI}, 0, 2 * time.Second}}
	check(beyond, attack(beyond)())
	check(filling, filled())
	noKey := []group{
		{"body trickled, no key", 50, slow{request: post(""), trickle: true}, 401, bound - time.Second},
		{"body never sent, no key", 50, slow{request: post("")}, 401, bound - time.Second},
	}
	check(noKey, attack(noKey)())

	after := openFiles()
	for deadline := time.Now().Add(slack); after > base && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		after = openFiles()
	}
	t.Logf("daemon's open files but the database's: %d before, %d with the cap full, %d after", base, peak, after)
	if after > base {
		t.Errorf("open files after the connections ended: got %d, want at most the %d before", after, base)
	}
	// One connection open: the one asking, once the earlier ones'
	// closes are counted.
	pollMetrics(t, func() string {
		resp, err := oneShot.Get(d.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		text, _ := io.ReadAll(resp.Body)
		return string(text)
	}, "stockade_api_connections_refused_total 100", "stockade_api_connections_open 1")
}
