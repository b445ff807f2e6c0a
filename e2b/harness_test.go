package e2b_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/e2b"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// env is a daemon in the test process, as `stockade serve` wires one
// with e2b.listen set: a SQLite store, the runc driver (sessions through
// the shim, their kernels the guest's test kernel unless real), the
// capability layer and the E2B server on a real listener, with one
// workspace and its agent key.
type env struct {
	t     *testing.T
	st    store.Store
	svc   *capability.Service
	srv   *e2b.Server
	url   string
	ws    model.Workspace
	agent string
}

// envOptions configure newEnv.
type envOptions struct {
	// sandboxes runs real sandboxes (root, runc, the python image);
	// without, the driver's guest does not exist and only what runs no
	// code is served.
	sandboxes bool
	// policy edits the workspace's policy; nil runs without approval.
	policy func(*model.Policy)
	// ttl is the sessions' TTL ceiling; zero is an hour.
	ttl time.Duration
	// gvisor runs the sessions on gVisor, which can pause them.
	gvisor bool
	// maxSessions bounds the workspace's live sessions; zero is the
	// default.
	maxSessions int
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	if o.sandboxes {
		testenv.RequiresRoot(t)
		testenv.RequiresBinary(t, "runc")
		testenv.Image(t, "python")
	}
	ctx := t.Context()
	st, err := storeopen.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "stockade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rcfg := runc.Config{StateDir: t.TempDir(), GuestPath: "/nonexistent/stockade-guest"}
	images := t.TempDir()
	var engOpts []engine.Option
	if o.sandboxes {
		rcfg.GuestPath, rcfg.Shim, images = testenv.Guest(t), testenv.Shim(t), testenv.DataDir()
		engOpts = append(engOpts, engine.WithTestKernel())
	}
	d, err := runc.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	drivers, def := map[string]sandbox.Driver{"runc": d}, "runc"
	so := capability.SessionOptions{}
	if o.gvisor {
		testenv.RequiresBinary(t, "runsc")
		gv, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
		if err != nil {
			t.Fatal(err)
		}
		drivers["gvisor"], def = gv, "gvisor"
		so.CheckpointDir = filepath.Join(t.TempDir(), "checkpoints")
	}
	eng, err := engine.New(drivers, def, image.Open(images), sandbox.DefaultLimits(), sandbox.DefaultCeiling(), engOpts...)
	if err != nil {
		t.Fatal(err)
	}
	ttl := o.ttl
	if ttl == 0 {
		ttl = time.Hour
	}
	so.TTL, so.MaxTTL, so.MaxPerWorkspace = ttl, ttl, o.maxSessions
	svc := capability.NewService(eng, st, capability.ServiceOptions{Sessions: so})
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(context.Background()) })
	e := &env{t: t, st: st, svc: svc}
	if e.ws, err = st.CreateWorkspace(ctx, "e2b", nil); err != nil {
		t.Fatal(err)
	}
	e.agent = e.newKey(e.ws.ID)
	pol, err := st.GetPolicy(ctx, e.ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	pol.Approval = model.ApprovalNone
	if o.policy != nil {
		o.policy(&pol)
	}
	if _, err := st.SetPolicy(ctx, e.ws.ID, pol, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GrantCredits(ctx, e.ws.ID, 1000, "e2b tests", nil); err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	so = svc.Options().Sessions
	e.srv, err = e2b.New(svc, st.(e2b.Store), e2b.Options{Secret: secret, TTL: so.MaxTTL, IdleTimeout: so.MaxIdleTimeout})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	go e.srv.Run(runCtx)
	hs := httptest.NewServer(e.srv)
	t.Cleanup(func() { stop(); hs.Close() })
	e.url = hs.URL
	return e
}

// newKey returns a new agent key of workspace ws.
func (e *env) newKey(ws string) string {
	e.t.Helper()
	k := "sk_test_e2b_" + rand.Text()
	if _, err := e.st.CreateAPIKey(e.t.Context(), store.NewAPIKey{WorkspaceID: ws, Role: model.RoleAgent, Hash: model.HashKey(k), Name: "agent"}); err != nil {
		e.t.Fatal(err)
	}
	return k
}

// reply is an HTTP answer, its body read whole.
type reply struct {
	code   int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
}

// do sends a request; body is JSON unless it is a []byte; hdr are name,
// value pairs.
func (e *env) do(method, path string, body any, hdr ...string) reply {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, ok := body.([]byte); !ok && body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: reading: %v", method, path, err)
	}
	return reply{code: resp.StatusCode, header: resp.Header, body: b}
}

// api sends a control-plane request with the agent key.
func (e *env) api(method, path string, body any) reply {
	e.t.Helper()
	return e.do(method, path, body, "X-API-Key", e.agent)
}

// box is a sandbox the test created: its id and token.
type box struct {
	ID, Token, Traffic string
}

// create creates a sandbox with body and returns it.
func (e *env) create(body map[string]any) box {
	e.t.Helper()
	r := e.api("POST", "/v2/sandboxes", body)
	if r.code != http.StatusCreated {
		e.t.Fatalf("create: %d %s", r.code, r.body)
	}
	var a struct {
		SandboxID, EnvdAccessToken, TrafficAccessToken, EnvdVersion string
	}
	r.json(e.t, &a)
	if a.SandboxID == "" || a.EnvdAccessToken == "" || a.EnvdVersion == "" {
		e.t.Fatalf("create answered %s: want sandboxID, envdAccessToken, envdVersion", r.body)
	}
	e.t.Cleanup(func() { e.do("DELETE", "/sandboxes/"+a.SandboxID, nil, "X-API-Key", e.agent) })
	return box{a.SandboxID, a.EnvdAccessToken, a.TrafficAccessToken}
}

// envd sends a request to sb's envd.
func (e *env) envd(sb box, method, path string, body any, hdr ...string) reply {
	e.t.Helper()
	return e.do(method, path, body, append([]string{"E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", e2b.EnvdPort, "X-Access-Token", sb.Token}, hdr...)...)
}

// rpc calls a unary Connect method of sb's envd.
func (e *env) rpc(sb box, method string, msg any) reply {
	e.t.Helper()
	return e.envd(sb, "POST", "/"+method, msg, "Connect-Protocol-Version", "1")
}

// frame is one envelope of a Connect stream.
type frame struct {
	flags byte
	msg   json.RawMessage
}

// envelope frames msg.
func envelope(msg []byte) []byte {
	var h [5]byte
	binary.BigEndian.PutUint32(h[1:], uint32(len(msg)))
	return append(h[:], msg...)
}

// stream calls a server-streaming Connect method of sb's envd and reads
// its frames to the end.
func (e *env) stream(sb box, method string, msg any, hdr ...string) (int, []frame) {
	e.t.Helper()
	j, err := json.Marshal(msg)
	if err != nil {
		e.t.Fatal(err)
	}
	r := e.envd(sb, "POST", "/"+method, envelope(j), append([]string{"Content-Type", "application/connect+json", "Connect-Protocol-Version", "1"}, hdr...)...)
	var out []frame
	b := r.body
	for len(b) >= 5 {
		n := binary.BigEndian.Uint32(b[1:5])
		if int(n) > len(b)-5 {
			e.t.Fatalf("a frame of %d bytes in %d", n, len(b)-5)
		}
		out = append(out, frame{b[0], json.RawMessage(b[5 : 5+n])})
		b = b[5+n:]
	}
	if len(b) != 0 {
		e.t.Fatalf("%d bytes after the last frame", len(b))
	}
	return r.code, out
}

// events decodes a process stream's frames: the event kinds in order,
// stdout and stderr decoded, the end event and the end-of-stream error.
type processRun struct {
	kinds          []string
	stdout, stderr string
	exitCode       int
	endErr         string
}

func (e *env) decodeProcess(frames []frame) processRun {
	e.t.Helper()
	var p processRun
	for _, f := range frames {
		if f.flags&2 != 0 {
			var end struct {
				Error *struct{ Code, Message string } `json:"error"`
			}
			if err := json.Unmarshal(f.msg, &end); err != nil {
				e.t.Fatalf("end of stream %s: %v", f.msg, err)
			}
			if end.Error != nil {
				p.endErr = end.Error.Code + ": " + end.Error.Message
			}
			continue
		}
		var ev struct {
			Event map[string]json.RawMessage `json:"event"`
		}
		if err := json.Unmarshal(f.msg, &ev); err != nil {
			e.t.Fatalf("event %s: %v", f.msg, err)
		}
		for k, v := range ev.Event {
			p.kinds = append(p.kinds, k)
			switch k {
			case "data":
				var d struct{ Stdout, Stderr []byte }
				if err := json.Unmarshal(v, &d); err != nil {
					e.t.Fatalf("data %s: %v", v, err)
				}
				p.stdout += string(d.Stdout)
				p.stderr += string(d.Stderr)
			case "end":
				var d struct {
					ExitCode int `json:"exitCode"`
				}
				_ = json.Unmarshal(v, &d)
				p.exitCode = d.ExitCode
			}
		}
	}
	return p
}

// errorBody checks r is E2B's error body with code r.code and returns
// its message.
func errorBody(t *testing.T, r reply) string {
	t.Helper()
	var b struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(r.body, &b); err != nil || b.Code == nil || b.Message == nil {
		t.Fatalf("want E2B's error body {code, message}, got %d %s", r.code, r.body)
	}
	if *b.Code != r.code {
		t.Errorf("error body's code %d, want the status %d", *b.Code, r.code)
	}
	return *b.Message
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
