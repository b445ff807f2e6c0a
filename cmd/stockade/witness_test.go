package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/witness"
)

// serveProc is a `stockade serve` process of a test.
type serveProc struct {
	cmd  *exec.Cmd
	url  string
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{} // closed when the process has exited
}

var servingLog = regexp.MustCompile(`msg="stockade serving" listen=(\S+)`)

// startServe runs `stockade serve` on db with the runc driver, no egress
// and state of its own, and waits until it listens. It is killed when the
// test ends, and its log shown if the test failed.
func startServe(t *testing.T, db string) *serveProc {
	t.Helper()
	dir := t.TempDir()
	// The docker driver points nowhere, so that the daemon's start-up reap
	// never touches containers of another Stockade on the host.
	cfg := filepath.Join(dir, "stockade.yaml")
	if err := os.WriteFile(cfg, []byte("driver: runc\ndocker_host: unix://"+filepath.Join(dir, "no-docker.sock")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &serveProc{done: make(chan struct{})}
	p.cmd = exec.Command(testenv.Build(t, "./cmd/stockade"), "serve", "--config", cfg, "--db", db, "--state-dir", filepath.Join(dir, "state"),
		"--guest", testenv.Guest(t), "--data-dir", testenv.DataDir(), "--listen", "127.0.0.1:0", "--egress=false")
	p.cmd.Env = append(os.Environ(), "STOCKADE_DRIVER=runc")
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting stockade serve: %v", err)
	}
	listening := make(chan string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.logs.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if m := servingLog.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case listening <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
		<-p.done
		if t.Failed() {
			t.Logf("stockade serve log:\n%s", p.log())
		}
	})
	select {
	case addr := <-listening:
		p.url = "http://" + addr
	case <-p.done:
		t.Fatalf("stockade serve exited before listening:\n%s", p.log())
	case <-time.After(90 * time.Second):
		t.Fatalf("stockade serve did not listen within 90 s:\n%s", p.log())
	}
	return p
}

func (p *serveProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// stop asks the daemon to shut down (it witnesses the chains once more)
// and waits for it.
func (p *serveProc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("stockade serve exited with %d after SIGTERM", code)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("stockade serve did not stop within 40 s of SIGTERM")
	}
}

// TestDaemonDoesNotWitnessARewrittenChain rewrites a witnessed audit chain
// consistently from its third event on, behind a running daemon, and pads
// it past the witnessed head, as an attacker with the database would:
// the daemon's witness tick must not move the witness to the forged head,
// it says so in its log and /metrics, and `audit verify` (run while the
// daemon runs, and after it stopped and witnessed once more) reports the
// break at the witnessed seq. On SQLite and PostgreSQL.
func TestDaemonDoesNotWitnessARewrittenChain(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	for _, backend := range []struct {
		name string
		open func(t *testing.T) auditDB
	}{{"sqlite", sqliteDB}, {"postgres", postgresDB}} {
		t.Run(backend.name, func(t *testing.T) {
			db := backend.open(t)
			wdir := t.TempDir()
			t.Setenv("STOCKADE_AUDIT_WITNESS", wdir)
			// Six events, each witnessed by the command that made it.
			id := makeBooks(t, db)
			witnessed, ok, err := witness.Dir(wdir).Read(id)
			if err != nil || !ok || witnessed.Seq != 6 {
				t.Fatalf("witness before the rewrite: got %+v (found %v, %v), want seq 6", witnessed, ok, err)
			}
			d := startServe(t, db.url)

			// The rewrite: events 3 to 6 gone, the head rewound to event
			// 2, and eight new events appended through the store, so that
			// every hash and link is right (the attacker's own commands
			// witness nothing of ours).
			for seq := 6; seq >= 3; seq-- {
				db.exec(t, fmt.Sprintf("DELETE FROM audit_events WHERE workspace_id = $1 AND seq = %d", seq), id)
			}
			db.exec(t, "UPDATE audit_chain_heads SET seq = 2, hash = (SELECT hash FROM audit_events WHERE workspace_id = $1 AND seq = 2) WHERE workspace_id = $1", id)
			elsewhere := t.TempDir()
			for range 8 {
				mustCLI(t, "credits", "grant", "books", "1", "--db", db.url, "--audit-witness", elsewhere)
			}
			if code, out, _ := cli(t, "audit", "verify", "--workspace", "books", "--db", db.url, "--audit-witness", elsewhere); code != 0 {
				t.Fatalf("the forged chain against its own witness: exit %d, %q; want it to look intact", code, out)
			}

			// The daemon's next tick (every 10 s) after the rewrite sees
			// the forged head. (A tick during the rewrite refuses too.)
			before := len(d.log())
			deadline := time.Now().Add(45 * time.Second)
			for !strings.Contains(d.log()[before:], "audit chain not witnessed") {
				if w, _, _ := witness.Dir(wdir).Read(id); w != witnessed {
					t.Errorf("the daemon witnessed the forged head %+v over %+v", w, witnessed)
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the daemon logged no refusal to witness within 45 s")
				}
				time.Sleep(200 * time.Millisecond)
			}
			if n := metric(t, d.url, "stockade_audit_witness_refusals_total"); n < 1 {
				t.Errorf("stockade_audit_witness_refusals_total: got %v, want at least 1", n)
			}
			verify := func(when string) {
				t.Helper()
				code, out, errOut := cli(t, "audit", "verify", "--db", db.url)
				books := lineFor(t, out, "workspace books ("+id+")")
				if code != 1 || !strings.Contains(books, "BROKEN at seq 6") || !strings.Contains(books, "rewritten") {
					t.Errorf("audit verify %s: got exit %d and %q (stderr %q); want exit 1 and the break at the witnessed seq 6", when, code, books, errOut)
				}
			}
			verify("while the daemon runs")
			d.stop(t)
			verify("after the daemon stopped")
			if w, _, _ := witness.Dir(wdir).Read(id); w != witnessed {
				t.Errorf("witness after the daemon stopped: got %+v, want the old %+v kept", w, witnessed)
			}
		})
	}
}

// metric reads a counter or gauge without labels from the daemon's
// /metrics.
func metric(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("/metrics has no %s:\n%s", name, body)
	}
	var v float64
	if _, err := fmt.Sscan(string(m[1]), &v); err != nil {
		t.Fatal(err)
	}
	return v
}
