package vercel_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/vercel"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestStartCutBeforeAnswer checks that a command the provider does not
// answer ends Start when its ctx ends or its timeout passes: the command's
// id comes with the answer, so nothing can be killed before it, and the
// request itself is cut. The sandbox serves no more Execs then.
func TestStartCutBeforeAnswer(t *testing.T) {
	s, d := newStub(t, vercel.Config{})
	s.set("POST /v2/sandboxes/sessions/sbx_ctx/cmd", true, nil)
	s.set("POST /v2/sandboxes/sessions/sbx_timeout/cmd", true, nil)
	req := sandbox.ExecRequest{Argv: []string{"/bin/true"}, Timeout: time.Hour}

	sb, err := d.Create(t.Context(), sandbox.Spec{ID: "ctx", Image: sandbox.Image{Name: "shell"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		// Without the request the cancel comes first: Start still
		// must end, and the check below still holds.
		s.arrival("POST /v2/sandboxes/sessions/sbx_ctx/cmd")
		cancel()
	}()
	if _, err := within(t, "Start whose ctx ended", func() (sandbox.Exec, error) { return sb.Start(ctx, req) }); !errors.Is(err, context.Canceled) {
		t.Errorf("Start whose ctx ended before the answer: got %v, want context.Canceled", err)
	}
	if _, err := sb.Start(t.Context(), req); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Start after a command was lost: got %v, want ErrFailedPrecondition", err)
	}

	sb, err = d.Create(t.Context(), sandbox.Spec{ID: "timeout", Image: sandbox.Image{Name: "shell"}})
	if err != nil {
		t.Fatal(err)
	}
	req.Timeout = 50 * time.Millisecond
	if _, err := within(t, "Start past its timeout", func() (sandbox.Exec, error) { return sb.Start(t.Context(), req) }); !errdefs.IsUnavailable(err) {
		t.Errorf("Start whose timeout passed before the answer: got %v, want ErrUnavailable", err)
	}
}

// TestCallsBounded checks that every call of the API is bounded by the
// call timeout whatever its ctx: a Destroy on a context without a
// deadline (as the engine destroys) and a Create on one return with
// ErrUnavailable when the provider does not answer.
func TestCallsBounded(t *testing.T) {
	s, d := newStub(t, vercel.Config{CallTimeout: 50 * time.Millisecond})
	sb, err := d.Create(t.Context(), sandbox.Spec{ID: "one", Image: sandbox.Image{Name: "shell"}})
	if err != nil {
		t.Fatal(err)
	}
	s.set("POST /v2/sandboxes/sessions/sbx_one/stop", true, nil)
	s.set("DELETE /v2/sandboxes/stockade-one", true, nil)
	if _, err := within(t, "Destroy", func() (any, error) { return nil, sb.Destroy(context.Background()) }); !errdefs.IsUnavailable(err) {
		t.Errorf("Destroy that the provider does not answer: got %v, want ErrUnavailable", err)
	}
	if n := s.saw("DELETE /v2/sandboxes/stockade-one"); n != 1 {
		t.Errorf("Destroy sent %d deletes after a stop that hung, want 1", n)
	}
	s.set("POST /v2/sandboxes", true, nil)
	if _, err := within(t, "Create", func() (sandbox.Sandbox, error) {
		return d.Create(context.Background(), sandbox.Spec{ID: "two", Image: sandbox.Image{Name: "shell"}})
	}); !errdefs.IsUnavailable(err) {
		t.Errorf("Create that the provider does not answer: got %v, want ErrUnavailable", err)
	}
}

// TestCreateLost checks that a create whose answer is lost or unreadable
// deletes the sandbox it may have made, by its name, and that one the
// provider refused (4xx) deletes nothing: a conflict names a sandbox
// that is not the request's.
func TestCreateLost(t *testing.T) {
	s, d := newStub(t, vercel.Config{})
	answer := func(status int, body string) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(body))
		}
	}
	for _, c := range []struct {
		name    string
		answer  func(http.ResponseWriter) // nil: none
		deletes int
	}{
		{"garbled", answer(200, `{"sandbox":`), 1},
		{"failed", answer(500, `{}`), 1},
		{"lost", nil, 1},
		{"conflict", answer(409, `{"error":{"message":"a sandbox of that name exists"}}`), 0},
		{"invalid", answer(400, `{}`), 0},
	} {
		s.set("POST /v2/sandboxes", c.answer == nil, c.answer)
		ctx, cancel := context.WithCancel(t.Context())
		if c.answer == nil {
			go func() {
				s.arrival("POST /v2/sandboxes")
				cancel()
			}()
		}
		_, err := within(t, "Create", func() (sandbox.Sandbox, error) {
			return d.Create(ctx, sandbox.Spec{ID: c.name, Image: sandbox.Image{Name: "shell"}})
		})
		cancel()
		if err == nil {
			t.Errorf("%s: Create succeeded", c.name)
		}
		if n := s.saw("DELETE /v2/sandboxes/stockade-" + c.name); n != c.deletes {
			t.Errorf("%s: Create sent %d deletes of its sandbox, want %d (%v)", c.name, n, c.deletes, err)
		}
	}
}

// TestReapKeepsClasses checks that Reap's error keeps the class of a
// sandbox's failed delete, and that it reaps the others.
func TestReapKeepsClasses(t *testing.T) {
	s, d := newStub(t, vercel.Config{})
	s.set("GET /v2/sandboxes", false, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"sandboxes":[{"name":"stockade-a","status":"running","tags":{"o":"x"}},{"name":"stockade-b","status":"running","tags":{"o":"x"}}],"pagination":{"next":null}}`))
	})
	s.set("DELETE /v2/sandboxes/stockade-a", false, func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusForbidden)
	})
	reaped, err := d.Reap(t.Context(), map[string]string{"o": "x"})
	if !errdefs.IsPermissionDenied(err) || len(reaped) != 1 || reaped[0] != "b" {
		t.Errorf("Reap with one delete refused: got %v, %v; want [b] and ErrPermissionDenied", reaped, err)
	}
}
