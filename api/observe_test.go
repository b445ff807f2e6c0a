package api

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestObservePanicAndOddMethods checks the request's line of a handler
// that panics (a 500, logged; net/http recovers the panic) and of a
// method HTTP does not define (named _OTHER, not as the client spelled it).
func TestObservePanicAndOddMethods(t *testing.T) {
	var logs bytes.Buffer
	s := &server{log: slog.New(slog.NewTextHandler(&logs, nil))}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /boom", func(http.ResponseWriter, *http.Request) { panic("boom") })
	h := s.observe(mux, mux)

	func() {
		defer func() {
			if recover() == nil {
				t.Error("the handler's panic did not reach net/http")
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/boom", nil))
	}()
	if l := logs.String(); !strings.Contains(l, `route="GET /boom" status=500`) || !strings.Contains(l, "level=ERROR") {
		t.Errorf("a handler that panicked: got log %q, want an ERROR line with status 500", l)
	}

	logs.Reset()
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("XFORGED", "/nothing", nil))
	if l := logs.String(); !strings.Contains(l, "method=_OTHER route=_OTHER") || strings.Contains(l, "XFORGED") {
		t.Errorf("an unknown method: got log %q, want it named _OTHER", l)
	}
}
