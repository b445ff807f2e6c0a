package vercel_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/vercel"
)

// stub is an API that answers what a test says, or nothing: unlike the
// fake it needs no machines, and it can hang.
type stub struct {
	mu      sync.Mutex
	seen    []string                               // "METHOD path" of each request
	hang    map[string]bool                        // by "METHOD path": no answer until the client gives up
	answer  map[string]func(w http.ResponseWriter) // by "METHOD path"; none: {} or the create's answer
	arrived chan string                            // each request's "METHOD path", when it arrives
	release chan struct{}                          // closed at the test's end: hanging handlers return
}

// newStub starts a stub and returns it and a driver over it.
func newStub(t *testing.T, cfg vercel.Config) (*stub, *vercel.Driver) {
	t.Helper()
	s := &stub{hang: map[string]bool{}, answer: map[string]func(http.ResponseWriter){}, arrived: make(chan string, 100), release: make(chan struct{})}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(s.release) })
	cfg.Token, cfg.TeamID, cfg.ProjectID, cfg.BaseURL = token, team, project, srv.URL
	d, err := vercel.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, d
}

func (s *stub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Method + " " + r.URL.Path
	s.mu.Lock()
	s.seen = append(s.seen, key)
	hang, answer := s.hang[key], s.answer[key]
	s.mu.Unlock()
	select {
	case s.arrived <- key:
	default:
	}
	switch {
	case hang:
		select {
		case <-r.Context().Done():
		case <-s.release:
		}
	case answer != nil:
		answer(w)
	case key == "POST /v2/sandboxes":
		var in struct{ Name string }
		_ = json.NewDecoder(r.Body).Decode(&in)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"sandbox": map[string]string{"name": in.Name, "status": "running"}, "session": map[string]string{"id": "sbx_" + strings.TrimPrefix(in.Name, "stockade-"), "status": "running"}})
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{}"))
	}
}

// set makes the stub hang on key (answer nil) or answer it so.
func (s *stub) set(key string, hang bool, answer func(w http.ResponseWriter)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hang[key], s.answer[key] = hang, answer
}

// saw returns how many requests of key the stub saw.
func (s *stub) saw(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range s.seen {
		if k == key {
			n++
		}
	}
	return n
}

// arrival waits until a request of key arrives; false if none does
// within 30 s.
func (s *stub) arrival(key string) bool {
	for {
		select {
		case k := <-s.arrived:
			if k == key {
				return true
			}
		case <-time.After(30 * time.Second):
			return false
		}
	}
}

// within returns f's error, or fails t when f does not return within a
// bound far beyond any the test sets (it catches a call that hangs, it
// times nothing).
func within[T any](t *testing.T, what string, f func() (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: still waiting for the provider after 30 s", what)
		panic("unreachable")
	}
}
