package e2b_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/e2b"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// TestControlPlaneRefusals checks what runs no sandbox: the key, the
// error shape of unknown sandboxes and routes, and the data plane of an
// unknown sandbox.
func TestControlPlaneRefusals(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, c := range []struct {
		name, method, path string
		hdr                []string
		want               int
	}{
		{"no key", "GET", "/v2/sandboxes", nil, http.StatusUnauthorized},
		{"bad key", "GET", "/v2/sandboxes", []string{"X-API-Key", "sk_nope"}, http.StatusUnauthorized},
		{"unknown sandbox", "GET", "/sandboxes/ses_0123", []string{"X-API-Key", e.agent}, http.StatusNotFound},
		{"kill unknown", "DELETE", "/sandboxes/ses_0123", []string{"X-API-Key", e.agent}, http.StatusNotFound},
		{"connect unknown", "POST", "/v2/sandboxes/ses_0123/connect", []string{"X-API-Key", e.agent}, http.StatusNotFound},
		{"unknown route", "GET", "/nope", []string{"X-API-Key", e.agent}, http.StatusNotFound},
		{"bad state", "GET", "/v2/sandboxes?state=gone", []string{"X-API-Key", e.agent}, http.StatusBadRequest},
		{"snapshot of an unknown sandbox", "POST", "/sandboxes/ses_0123/snapshots", []string{"X-API-Key", e.agent}, http.StatusNotFound},
		{"snapshots of an unknown sandbox", "GET", "/snapshots?sandboxID=ses_0123", []string{"X-API-Key", e.agent}, http.StatusNotFound},
		{"delete an unknown snapshot", "DELETE", "/templates/snp_0123", []string{"X-API-Key", e.agent}, http.StatusNotFound},
		{"fork an unknown sandbox", "POST", "/sandboxes/ses_0123/fork", []string{"X-API-Key", e.agent}, http.StatusNotFound},
		{"network of an unknown sandbox", "PUT", "/sandboxes/ses_0123/network", []string{"X-API-Key", e.agent}, http.StatusNotFound},
		{"snapshots with no key", "GET", "/snapshots", nil, http.StatusUnauthorized},
		{"data plane of an unknown sandbox", "GET", "/health", []string{"E2b-Sandbox-Id", "ses_0123", "E2b-Sandbox-Port", e2b.EnvdPort}, http.StatusBadGateway},
		{"unknown port", "GET", "/health", []string{"E2b-Sandbox-Id", "ses_0123", "E2b-Sandbox-Port", "8080"}, http.StatusBadGateway},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.do(c.method, c.path, nil, c.hdr...)
			if r.code != c.want {
				t.Fatalf("%s %s: %d %s, want %d", c.method, c.path, r.code, r.body, c.want)
			}
			errorBody(t, r)
		})
	}
	// An empty list is a list.
	for _, path := range []string{"/v2/sandboxes", "/snapshots"} {
		r := e.api("GET", path, nil)
		if r.code != http.StatusOK || string(bytes.TrimSpace(r.body)) != "[]" {
			t.Errorf("list %s: %d %s, want 200 []", path, r.code, r.body)
		}
	}
}

// TestSandbox drives one sandbox through the wire the SDKs speak:
// create, get, list by metadata, envd's files and filesystem services, a
// command cell streamed (stdout, exit code 3), its tool_calls row and
// credits, a Connect-Timeout-Ms that ends a command, another workspace's
// 404s, kill, and the 502 of the data plane after it; on runc and on
// gVisor.
func TestSandbox(t *testing.T) {
	for _, gv := range []bool{false, true} {
		name := map[bool]string{false: "runc", true: "gvisor"}[gv]
		t.Run(name, func(t *testing.T) { testSandbox(t, gv) })
	}
}

func testSandbox(t *testing.T, gvisor bool) {
	e := newEnv(t, envOptions{sandboxes: true, gvisor: gvisor})
	sb := e.create(map[string]any{"templateID": "base", "metadata": map[string]string{"suite": "e2b", "n": "1"},
		"envVars": map[string]string{"GREETING": "hello"}, "timeout": 600})

	t.Run("get and list", func(t *testing.T) {
		r := e.api("GET", "/sandboxes/"+sb.ID, nil)
		var got struct {
			SandboxID, State, EnvdAccessToken string
			Metadata                          map[string]string
		}
		r.json(t, &got)
		if r.code != 200 || got.SandboxID != sb.ID || got.State != "running" || got.EnvdAccessToken != sb.Token || got.Metadata["suite"] != "e2b" {
			t.Errorf("get: %d %s", r.code, r.body)
		}
		for _, c := range []struct {
			query string
			want  int
		}{{"?metadata=suite%3De2b", 1}, {"?metadata=suite%3Dother", 0}, {"?state=paused", 0}, {"?state=running,paused", 1}} {
			var l []struct{ SandboxID string }
			r := e.api("GET", "/v2/sandboxes"+c.query, nil)
			r.json(t, &l)
			if len(l) != c.want {
				t.Errorf("list %s: %s, want %d", c.query, r.body, c.want)
			}
		}
		// The token is stable across a connect of a running sandbox.
		r = e.api("POST", "/v2/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 600})
		var c struct{ EnvdAccessToken string }
		r.json(t, &c)
		if r.code != 200 || c.EnvdAccessToken != sb.Token {
			t.Errorf("connect: %d %s, want 200 and the create's token", r.code, r.body)
		}
	})

	t.Run("other workspace", func(t *testing.T) {
		ws, err := e.st.CreateWorkspace(t.Context(), "other", nil)
		if err != nil {
			t.Fatal(err)
		}
		key := e.newKey(ws.ID)
		for _, m := range []string{"GET", "DELETE"} {
			r := e.do(m, "/sandboxes/"+sb.ID, nil, "X-API-Key", key)
			if r.code != http.StatusNotFound {
				t.Errorf("%s by another workspace: %d %s, want 404", m, r.code, r.body)
			}
			errorBody(t, r)
		}
		// The data plane without the sandbox's token is refused.
		r := e.do("GET", "/health", nil, "E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", e2b.EnvdPort, "X-Access-Token", "wrong")
		if r.code != http.StatusUnauthorized {
			t.Errorf("health with a wrong token: %d, want 401", r.code)
		}
	})

	t.Run("files", func(t *testing.T) {
		if r := e.envd(sb, "GET", "/health", nil); r.code != http.StatusNoContent {
			t.Fatalf("health: %d %s", r.code, r.body)
		}
		// octet-stream, gzip
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write([]byte("zipped\n"))
		zw.Close()
		r := e.envd(sb, "POST", "/files?path=/home/user/z.txt", gz.Bytes(), "Content-Type", "application/octet-stream", "Content-Encoding", "gzip")
		var w []struct{ Name, Type, Path string }
		r.json(t, &w)
		if r.code != 200 || len(w) != 1 || w[0].Path != "/home/user/z.txt" || w[0].Type != "file" {
			t.Fatalf("octet-stream upload: %d %s", r.code, r.body)
		}
		// multipart, two files named by their parts
		var mp bytes.Buffer
		mw := multipart.NewWriter(&mp)
		for _, f := range []struct{ name, data string }{{"a.txt", "A"}, {"dir/b.txt", "B"}} {
			pw, _ := mw.CreateFormFile("file", f.name)
			pw.Write([]byte(f.data))
		}
		mw.Close()
		r = e.envd(sb, "POST", "/files", mp.Bytes(), "Content-Type", mw.FormDataContentType())
		r.json(t, &w)
		if r.code != 200 || len(w) != 2 || w[1].Path != "/home/user/dir/b.txt" {
			t.Fatalf("multipart upload: %d %s", r.code, r.body)
		}
		if r := e.envd(sb, "GET", "/files?path=z.txt", nil); r.code != 200 || string(r.body) != "zipped\n" {
			t.Errorf("read z.txt: %d %q", r.code, r.body)
		}
		// downloadUrl and uploadUrl: signed, with no sandbox id.
		sign := func(path, op, exp string) string {
			raw := path + ":" + op + "::" + sb.Token
			if exp != "" {
				raw += ":" + exp
			}
			sum := sha256.Sum256([]byte(raw))
			q := url.Values{"path": {path}, "signature": {"v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")}}
			if exp != "" {
				q.Set("signature_expiration", exp)
			}
			return "/files?" + q.Encode()
		}
		if r := e.do("GET", sign("/home/user/z.txt", "read", ""), nil); r.code != 200 || string(r.body) != "zipped\n" {
			t.Errorf("downloadUrl: %d %q", r.code, r.body)
		}
		later := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
		if r := e.do("POST", sign("/home/user/up.txt", "write", later), []byte("up"), "Content-Type", "application/octet-stream"); r.code != 200 {
			t.Errorf("uploadUrl: %d %s", r.code, r.body)
		}
		if r := e.envd(sb, "GET", "/files?path=up.txt", nil); string(r.body) != "up" {
			t.Errorf("the file uploadUrl wrote: %d %q", r.code, r.body)
		}
		past := strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10)
		for _, u := range []string{sign("/home/user/z.txt", "write", ""), sign("/home/user/z.txt", "read", past), "/files?path=/home/user/z.txt"} {
			if r := e.do("GET", u, nil); r.code != http.StatusUnauthorized {
				t.Errorf("GET %s: %d %s, want 401", u, r.code, r.body)
			}
		}
		if r := e.envd(sb, "GET", "/files?path=/home/user/missing", nil); r.code != http.StatusNotFound {
			t.Errorf("read a missing file: %d %s, want 404", r.code, r.body)
		}
		r = e.envd(sb, "POST", "/files?path=/etc/passwd", []byte("x"), "Content-Type", "application/octet-stream")
		if r.code != http.StatusBadRequest || !contains(errorBody(t, r), "outside the sandbox's writable tree") {
			t.Errorf("write outside the tree: %d %s, want 400 naming the writable tree", r.code, r.body)
		}

		// filesystem.Filesystem
		r = e.rpc(sb, "filesystem.Filesystem/ListDir", map[string]any{"path": "/home/user", "depth": 2})
		var l struct {
			Entries []struct{ Name, Type, Path string }
		}
		r.json(t, &l)
		names := map[string]string{}
		for _, en := range l.Entries {
			names[en.Path] = en.Type
		}
		if r.code != 200 || names["/home/user/a.txt"] != "FILE_TYPE_FILE" || names["/home/user/dir"] != "FILE_TYPE_DIRECTORY" || names["/home/user/dir/b.txt"] != "FILE_TYPE_FILE" {
			t.Errorf("ListDir: %d %s", r.code, r.body)
		}
		if r := e.rpc(sb, "filesystem.Filesystem/MakeDir", map[string]any{"path": "new/deep"}); r.code != 200 {
			t.Errorf("MakeDir: %d %s", r.code, r.body)
		}
		if r := e.rpc(sb, "filesystem.Filesystem/MakeDir", map[string]any{"path": "new/deep"}); r.code != http.StatusConflict || !contains(string(r.body), "already_exists") {
			t.Errorf("MakeDir again: %d %s, want 409 already_exists", r.code, r.body)
		}
		if r := e.rpc(sb, "filesystem.Filesystem/Move", map[string]any{"source": "a.txt", "destination": "new/a.txt"}); r.code != 200 {
			t.Errorf("Move: %d %s", r.code, r.body)
		}
		if r := e.rpc(sb, "filesystem.Filesystem/Stat", map[string]any{"path": "a.txt"}); r.code != http.StatusNotFound || !contains(string(r.body), "not_found") {
			t.Errorf("Stat of the moved file: %d %s, want 404 not_found", r.code, r.body)
		}
		// Remove is recursive, as envd's.
		if r := e.rpc(sb, "filesystem.Filesystem/Remove", map[string]any{"path": "new"}); r.code != 200 {
			t.Errorf("Remove of a directory with files: %d %s", r.code, r.body)
		}
		if r := e.rpc(sb, "filesystem.Filesystem/Stat", map[string]any{"path": "new/deep"}); r.code != http.StatusNotFound {
			t.Errorf("Stat after Remove: %d %s, want 404", r.code, r.body)
		}
		if r := e.rpc(sb, "filesystem.Filesystem/Stat", map[string]any{"path": "/tmp"}); r.code != http.StatusBadRequest || !contains(string(r.body), "invalid_argument") {
			t.Errorf("Stat outside the tree: %d %s, want 400 invalid_argument", r.code, r.body)
		}
		if r := e.rpc(sb, "filesystem.Filesystem/Nope", map[string]any{}); r.code != http.StatusNotImplemented || !contains(string(r.body), "unimplemented") {
			t.Errorf("an unknown method: %d %s, want 501 unimplemented", r.code, r.body)
		}

		// WatchDir sees a write, by name relative to the directory.
		watched := make(chan []frame, 1)
		go func() {
			_, frames := e.stream(sb, "filesystem.Filesystem/WatchDir", map[string]any{"path": "/home/user"}, "Connect-Timeout-Ms", "2500")
			watched <- frames
		}()
		time.Sleep(800 * time.Millisecond)
		if r := e.envd(sb, "POST", "/files?path=watched.txt", []byte("w"), "Content-Type", "application/octet-stream"); r.code != 200 {
			t.Fatalf("write: %d %s", r.code, r.body)
		}
		frames := <-watched
		var kinds []string
		for _, f := range frames {
			var ev struct {
				Start      *struct{}         `json:"start"`
				Filesystem map[string]string `json:"filesystem"`
			}
			_ = json.Unmarshal(f.msg, &ev)
			switch {
			case f.flags&2 != 0:
				kinds = append(kinds, "end "+string(f.msg))
			case ev.Start != nil:
				kinds = append(kinds, "start")
			case ev.Filesystem != nil:
				kinds = append(kinds, ev.Filesystem["type"]+" "+ev.Filesystem["name"])
			}
		}
		if len(kinds) < 3 || kinds[0] != "start" || !slices.Contains(kinds, "EVENT_TYPE_CREATE watched.txt") || kinds[len(kinds)-1] != "end {}" {
			t.Errorf("WatchDir: %v, want start, the create of watched.txt, the end", kinds)
		}
	})

	t.Run("commands", func(t *testing.T) {
		before, err := e.st.GetCredits(t.Context(), e.ws.ID)
		if err != nil {
			t.Fatal(err)
		}
		code, frames := e.stream(sb, "process.Process/Start", map[string]any{
			"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", "echo hi; echo $GREETING $FROM; pwd; echo err >&2; exit 3"},
				"envs": map[string]string{"FROM": "cmd"}, "cwd": "/home/user/dir"}},
			// The SDK's own timeout, above the policy's 30 s: lowered to it.
			"Authorization", "Basic dXNlcjo=", "Connect-Timeout-Ms", "60000")
		p := e.decodeProcess(frames)
		if code != 200 || len(p.kinds) < 2 || p.kinds[0] != "start" || p.kinds[len(p.kinds)-1] != "end" {
			t.Fatalf("Start: %d, events %v (%s)", code, p.kinds, p.endErr)
		}
		if p.stdout != "hi\nhello cmd\n/workspace/dir\n" || p.stderr != "err\n" || p.exitCode != 3 || p.endErr != "" {
			t.Errorf("Start: stdout %q stderr %q exit %d end %q; want hi, the envs, the cwd, err, 3", p.stdout, p.stderr, p.exitCode, p.endErr)
		}
		after, err := e.st.GetCredits(t.Context(), e.ws.ID)
		if err != nil {
			t.Fatal(err)
		}
		if before.Available-after.Available != 2 {
			t.Errorf("credits: %d then %d, want 2 charged for the command cell", before.Available, after.Available)
		}
		page, err := e.st.ListExecutions(t.Context(), e.ws.ID, store.ExecutionFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) != 1 || page.Items[0].SessionID != sb.ID || page.Items[0].Status != "failed" {
			t.Errorf("executions: %+v, want the one command cell of the session, failed (exit 3)", page.Items)
		}

		// Connect-Timeout-Ms ends the process.
		start := time.Now()
		_, frames = e.stream(sb, "process.Process/Start", map[string]any{
			"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-c", "sleep 30"}}}, "Connect-Timeout-Ms", "1500")
		p = e.decodeProcess(frames)
		if !contains(p.endErr, "deadline_exceeded") || time.Since(start) > 20*time.Second {
			t.Errorf("a command past its Connect-Timeout-Ms: events %v end %q after %v, want deadline_exceeded", p.kinds, p.endErr, time.Since(start))
		}
		// The sandbox runs the next command: the previous one ended.
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, frames = e.stream(sb, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "/bin/true"}})
			if p = e.decodeProcess(frames); p.endErr == "" || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if p.endErr != "" || p.exitCode != 0 {
			t.Errorf("a command after the timed-out one: %v %q", p.kinds, p.endErr)
		}
		// A malformed envelope is a clear error.
		r := e.envd(sb, "POST", "/process.Process/Start", []byte{0, 0, 0}, "Content-Type", "application/connect+json")
		if !contains(string(r.body), "invalid_argument") {
			t.Errorf("a cut envelope: %d %q, want invalid_argument", r.code, r.body)
		}
		_, frames = e.stream(sb, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "/bin/bash"}, "pty": map[string]any{"size": map[string]int{"cols": 80, "rows": 24}}})
		if p := e.decodeProcess(frames); !contains(p.endErr, "unimplemented") {
			t.Errorf("a pty: %+v, want unimplemented", p)
		}
		if r := e.rpc(sb, "process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": 1}, "signal": "SIGNAL_SIGKILL"}); r.code != http.StatusNotFound {
			t.Errorf("signal to no process: %d %s, want 404 not_found", r.code, r.body)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		r := e.api("POST", "/sandboxes/"+sb.ID+"/timeout", map[string]any{"timeout": 900})
		if r.code != http.StatusNoContent {
			t.Fatalf("timeout: %d %s", r.code, r.body)
		}
		rec, err := e.st.(store.E2BSandboxes).GetE2BSandbox(t.Context(), sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Until(rec.EndAt); d < 850*time.Second || d > 900*time.Second {
			t.Errorf("end after setTimeout(900 s) is in %v", d)
		}
	})

	t.Run("kill", func(t *testing.T) {
		if r := e.api("DELETE", "/sandboxes/"+sb.ID, nil); r.code != http.StatusNoContent {
			t.Fatalf("kill: %d %s", r.code, r.body)
		}
		if r := e.api("DELETE", "/sandboxes/"+sb.ID, nil); r.code != http.StatusNotFound {
			t.Errorf("kill again: %d %s, want 404", r.code, r.body)
		}
		if r := e.api("GET", "/sandboxes/"+sb.ID, nil); r.code != http.StatusNotFound {
			t.Errorf("get after kill: %d %s, want 404", r.code, r.body)
		}
		if r := e.envd(sb, "GET", "/health", nil); r.code != http.StatusBadGateway {
			t.Errorf("health after kill: %d %s, want 502", r.code, r.body)
		}
		// A Connect call is refused with a Connect error: unavailable,
		// which the SDKs take for a sandbox that is not running.
		r := e.envd(sb, "POST", "/process.Process/Start", envelope([]byte(`{"process":{"cmd":"/bin/true"}}`)), "Content-Type", "application/connect+json")
		var ce struct{ Code string }
		r.json(t, &ce)
		if r.code != http.StatusBadGateway || ce.Code != "unavailable" {
			t.Errorf("Start after kill: %d %s, want 502 unavailable", r.code, r.body)
		}
	})
	// The audit chain verifies after it all.
	verifyChain(t, e)
}

// TestSandboxTimeoutEnds checks the sweep: a sandbox past its timeout
// ends, as E2B kills it. Its workspace may have one sandbox: another is
// 429 meanwhile.
func TestSandboxTimeoutEnds(t *testing.T) {
	e := newEnv(t, envOptions{sandboxes: true, maxSessions: 1})
	sb := e.create(map[string]any{"timeout": 600})
	if r := e.api("POST", "/v2/sandboxes", nil); r.code != http.StatusTooManyRequests {
		t.Errorf("a second sandbox past the workspace's bound: %d %s, want 429", r.code, r.body)
	} else {
		errorBody(t, r)
	}
	if r := e.api("POST", "/sandboxes/"+sb.ID+"/timeout", map[string]any{"timeout": 1}); r.code != http.StatusNoContent {
		t.Fatalf("setTimeout(1 s): %d %s", r.code, r.body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := e.api("GET", "/sandboxes/"+sb.ID, nil)
		if r.code == http.StatusNotFound {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a sandbox with a 1 s timeout is still there after 30 s: %d %s", r.code, r.body)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestKillCutsStream checks that a command's stream in flight ends when
// its sandbox is killed.
func TestKillCutsStream(t *testing.T) {
	e := newEnv(t, envOptions{sandboxes: true})
	sb := e.create(nil)
	done := make(chan processRun, 1)
	go func() {
		_, frames := e.stream(sb, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "/bin/sleep", "args": []string{"60"}}})
		done <- e.decodeProcess(frames)
	}()
	// Kill once the command runs.
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := e.rpc(sb, "process.Process/List", map[string]any{})
		var l struct{ Processes []json.RawMessage }
		r.json(t, &l)
		if len(l.Processes) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command never showed in List: %s", r.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := e.api("DELETE", "/sandboxes/"+sb.ID, nil); r.code != http.StatusNoContent {
		t.Fatalf("kill: %d %s", r.code, r.body)
	}
	select {
	case p := <-done:
		if p.endErr == "" {
			t.Errorf("the stream of a killed sandbox ended without an error: %v", p.kinds)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stream of a killed sandbox is still open after 20 s")
	}
}

// verifyChain checks the workspace's audit chain.
func verifyChain(t *testing.T, e *env) {
	t.Helper()
	ok, broken, err := e.st.VerifyChain(t.Context(), e.ws.ID)
	if err != nil || !ok {
		t.Errorf("audit chain: ok %v, broken at %+v, err %v", ok, broken, err)
	}
}

// TestPauseConnect pauses a gVisor sandbox and connects to it again: a
// second pause is 409, the paused sandbox's data plane 502, the list
// shows it paused, connect resumes it (201) with the same token, and its
// files and commands work again.
func TestPauseConnect(t *testing.T) {
	e := newEnv(t, envOptions{sandboxes: true, gvisor: true})
	sb := e.create(nil)
	if r := e.envd(sb, "POST", "/files?path=kept.txt", []byte("kept"), "Content-Type", "application/octet-stream"); r.code != 200 {
		t.Fatalf("write: %d %s", r.code, r.body)
	}
	if r := e.api("POST", "/sandboxes/"+sb.ID+"/pause", nil); r.code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", r.code, r.body)
	}
	if r := e.api("POST", "/sandboxes/"+sb.ID+"/pause", nil); r.code != http.StatusConflict {
		t.Errorf("pause of a paused sandbox: %d %s, want 409", r.code, r.body)
	} else {
		errorBody(t, r)
	}
	if r := e.envd(sb, "GET", "/health", nil); r.code != http.StatusBadGateway {
		t.Errorf("health of a paused sandbox: %d %s, want 502", r.code, r.body)
	}
	var l []struct{ SandboxID, State string }
	e.api("GET", "/v2/sandboxes?state=paused", nil).json(t, &l)
	if len(l) != 1 || l[0].State != "paused" {
		t.Errorf("list of paused sandboxes: %+v", l)
	}
	r := e.api("POST", "/v2/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 300})
	var c struct{ EnvdAccessToken string }
	r.json(t, &c)
	if r.code != http.StatusCreated || c.EnvdAccessToken != sb.Token {
		t.Fatalf("connect to a paused sandbox: %d %s, want 201 and the first token", r.code, r.body)
	}
	if r := e.envd(sb, "GET", "/files?path=kept.txt", nil); r.code != 200 || string(r.body) != "kept" {
		t.Errorf("read after resume: %d %q", r.code, r.body)
	}
	_, frames := e.stream(sb, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", "cat kept.txt"}}})
	if p := e.decodeProcess(frames); p.stdout != "kept" || p.exitCode != 0 || p.endErr != "" {
		t.Errorf("a command after resume: %+v", p)
	}
	// autoPause: the timeout pauses it instead of ending it.
	ap := e.create(map[string]any{"timeout": 1, "autoPause": true})
	deadline := time.Now().Add(30 * time.Second)
	for {
		var info struct{ State string }
		r := e.api("GET", "/sandboxes/"+ap.ID, nil)
		r.json(t, &info)
		if info.State == "paused" {
			break
		}
		if r.code != 200 || time.Now().After(deadline) {
			t.Fatalf("an autoPause sandbox past its 1 s timeout: %d %s, want it paused", r.code, r.body)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestInternetAccess checks allow_internet_access: asked on /v2 it is
// the session's network, which the policy refuses here in E2B's error
// shape; /sandboxes (whose SDKs always send true) does not read it.
func TestInternetAccess(t *testing.T) {
	e := newEnv(t, envOptions{sandboxes: true})
	r := e.api("POST", "/v2/sandboxes", map[string]any{"allow_internet_access": true})
	if r.code < 400 || r.code >= 500 {
		t.Fatalf("v2 create with internet access under a policy without network: %d %s, want a refusal", r.code, r.body)
	}
	errorBody(t, r)
	r = e.api("POST", "/sandboxes", map[string]any{"templateID": "base", "allow_internet_access": true, "secure": true, "timeout": 300})
	if r.code != http.StatusCreated {
		t.Fatalf("v1 create: %d %s, want 201", r.code, r.body)
	}
	var a struct{ SandboxID string }
	r.json(t, &a)
	var info struct{ AllowInternetAccess *bool }
	e.api("GET", "/sandboxes/"+a.SandboxID, nil).json(t, &info)
	if info.AllowInternetAccess == nil || *info.AllowInternetAccess {
		t.Errorf("v1 sandbox's allowInternetAccess: %v, want false", info.AllowInternetAccess)
	}
	// Its data plane acts as its key: revoked, it is refused.
	var tok struct{ EnvdAccessToken string }
	r.json(t, &tok)
	sb := box{ID: a.SandboxID, Token: tok.EnvdAccessToken}
	if r := e.envd(sb, "GET", "/health", nil); r.code != http.StatusNoContent {
		t.Fatalf("health: %d %s", r.code, r.body)
	}
	p, err := e.svc.Authenticate(t.Context(), e.agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.st.RevokeAPIKey(t.Context(), e.ws.ID, p.KeyID, nil); err != nil {
		t.Fatal(err)
	}
	if r := e.envd(sb, "GET", "/health", nil); r.code != http.StatusUnauthorized {
		t.Errorf("health of a sandbox whose key is revoked: %d %s, want 401", r.code, r.body)
	}
	if _, err := e.svc.CloseSession(t.Context(), p, a.SandboxID); err != nil {
		t.Fatal(err)
	}
}

// TestApprovalGatedCommand runs a command under a policy that asks a
// human for each cell: its stream starts at once and sends keepalives
// while it waits, the command runs once approved; a denied one ends its
// stream with permission_denied and is not charged.
func TestApprovalGatedCommand(t *testing.T) {
	e := newEnv(t, envOptions{sandboxes: true, policy: func(p *model.Policy) { p.Approval = model.ApprovalRequired }})
	sb := e.create(nil)
	approverKey := "sk_test_approver_" + rand.Text()
	if _, err := e.st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: e.ws.ID, Role: model.RoleApprover, Hash: model.HashKey(approverKey), Name: "approver"}); err != nil {
		t.Fatal(err)
	}
	approver, err := e.svc.Authenticate(t.Context(), approverKey)
	if err != nil {
		t.Fatal(err)
	}
	decide := func(approve bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			page, err := e.st.ListApprovals(t.Context(), e.ws.ID, store.ApprovalFilter{Statuses: []model.ApprovalStatus{model.ApprovalPending}})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Items) == 1 {
				time.Sleep(1500 * time.Millisecond) // a keepalive or two meanwhile
				if _, _, err := e.svc.Decide(t.Context(), approver, page.Items[0].ID, approve, "test"); err != nil {
					t.Fatal(err)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no approval pending after 20 s")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	run := func(cmd string) processRun {
		done := make(chan processRun, 1)
		go func() {
			_, frames := e.stream(sb, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-c", cmd}}},
				"Keepalive-Ping-Interval", "1")
			done <- e.decodeProcess(frames)
		}()
		return <-done
	}
	got := make(chan processRun, 1)
	go func() { got <- run("echo approved") }()
	decide(true)
	p := <-got
	if p.stdout != "approved\n" || p.exitCode != 0 || p.kinds[0] != "start" || !slices.Contains(p.kinds, "keepalive") {
		t.Errorf("an approved command: %+v, want start, keepalives, its output", p)
	}
	before, _ := e.st.GetCredits(t.Context(), e.ws.ID)
	go func() { got <- run("echo denied") }()
	decide(false)
	p = <-got
	if !contains(p.endErr, "permission_denied") || p.stdout != "" {
		t.Errorf("a denied command: %+v, want permission_denied and no output", p)
	}
	// Nobody decides before the request's timeout: the stream ends
	// naming the approval, and nothing is charged.
	_, frames := e.stream(sb, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "/bin/true"}},
		"Keepalive-Ping-Interval", "1", "Connect-Timeout-Ms", "1500")
	p = e.decodeProcess(frames)
	if !contains(p.endErr, "deadline_exceeded") || !contains(p.endErr, "awaits approval apr") {
		t.Errorf("a command whose approval outlasts its timeout: %+v, want deadline_exceeded naming the approval", p)
	}
	after, _ := e.st.GetCredits(t.Context(), e.ws.ID)
	if after.Available != before.Available {
		t.Errorf("credits %d then %d: a denied command, and one cancelled awaiting approval, are not charged", before.Available, after.Available)
	}
}

// TestBackgroundCommand follows a background command as the SDKs do: it
// shows in List, another command meanwhile is aborted (one cell at a
// time), SendInput and CloseStdin reach its stdin, and SendSignal kills
// the next one.
func TestBackgroundCommand(t *testing.T) {
	e := newEnv(t, envOptions{sandboxes: true})
	sb := e.create(nil)
	start := func(cmd string, stdin bool) <-chan processRun {
		done := make(chan processRun, 1)
		go func() {
			_, frames := e.stream(sb, "process.Process/Start", map[string]any{"stdin": stdin,
				"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-c", cmd}}}, "Keepalive-Ping-Interval", "1")
			done <- e.decodeProcess(frames)
		}()
		return done
	}
	pid := func() uint32 {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var l struct {
				Processes []struct {
					Pid    uint32
					Config struct{ Cmd string }
				}
			}
			e.rpc(sb, "process.Process/List", map[string]any{}).json(t, &l)
			if len(l.Processes) == 1 && l.Processes[0].Config.Cmd == "/bin/bash" {
				return l.Processes[0].Pid
			}
			if time.Now().After(deadline) {
				t.Fatalf("no process in List after 20 s: %+v", l)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	done := start("cat", true)
	n := pid()
	// Input right after the start event, before the program may have
	// started, waits for it.
	sel := map[string]any{"pid": n}
	if r := e.rpc(sb, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"stdin": "aGkK"}}); r.code != 200 {
		t.Errorf("SendInput right after the start: %d %s", r.code, r.body)
	}
	_, frames := e.stream(sb, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "/bin/true"}})
	if p := e.decodeProcess(frames); !contains(p.endErr, "aborted") {
		t.Errorf("a command while another runs: %+v, want aborted", p)
	}
	if r := e.rpc(sb, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"stdin": "aGVsbG8K"}}); r.code != 200 {
		t.Errorf("SendInput: %d %s", r.code, r.body)
	}
	if r := e.rpc(sb, "process.Process/CloseStdin", map[string]any{"process": sel}); r.code != 200 {
		t.Errorf("CloseStdin: %d %s", r.code, r.body)
	}
	select {
	case p := <-done:
		if p.stdout != "hi\nhello\n" || p.exitCode != 0 || p.endErr != "" {
			t.Errorf("cat fed hi and hello: %+v", p)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("cat did not end after CloseStdin")
	}
	done = start("sleep 60", false)
	n = pid()
	if r := e.rpc(sb, "process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": n}, "signal": "SIGNAL_SIGKILL"}); r.code != 200 {
		t.Errorf("SendSignal: %d %s", r.code, r.body)
	}
	select {
	case p := <-done:
		if p.exitCode == 0 || p.kinds[len(p.kinds)-1] != "end" {
			t.Errorf("a killed command: %+v, want an end with a non-zero exit", p)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a killed command's stream did not end")
	}
}
