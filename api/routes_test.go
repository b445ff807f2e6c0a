package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/wire"
)

// TestWrongMethod sends every method to every path of the route table:
// each method the path has no route for must be answered 405, with the
// path's methods in Allow, in the JSON error shape. The table is the
// server's own, so that a new route cannot be left out.
func TestWrongMethod(t *testing.T) {
	// No handler of a route runs, so the handler needs no service.
	h := New(nil, nil, Options{Metrics: NewMetrics()})
	allowed := map[string][]string{} // path -> its methods
	for _, rt := range (&server{opts: Options{Metrics: NewMetrics()}}).routes() {
		method, path, _ := strings.Cut(rt.pattern, " ")
		allowed[path] = append(allowed[path], method)
		if method == http.MethodGet {
			allowed[path] = append(allowed[path], http.MethodHead)
		}
	}
	methods := []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
	for path, ms := range allowed {
		url := strings.NewReplacer("{id}", "x_1", "{name}", "code.execute").Replace(path)
		for _, m := range methods {
			if slices.Contains(ms, m) {
				continue
			}
			t.Run(m+" "+path, func(t *testing.T) {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(m, url, nil))
				if rec.Code != http.StatusMethodNotAllowed {
					t.Fatalf("status: got %d, want 405 (body %s)", rec.Code, rec.Body)
				}
				want := slices.Sorted(slices.Values(ms))
				got := strings.Split(rec.Header().Get("Allow"), ", ")
				slices.Sort(got)
				if !slices.Equal(got, want) {
					t.Errorf("Allow: got %q, want %q", rec.Header().Get("Allow"), want)
				}
				if m == http.MethodHead {
					return // a HEAD answer has no body
				}
				var body wire.ErrorBody
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code != "method_not_allowed" || !strings.Contains(body.Error.Message, url) {
					t.Errorf("body: got %s (%v), want a method_not_allowed error naming the path", rec.Body, err)
				}
			})
		}
	}
	for _, path := range []string{"/v1/nothing", "/v1/executions/x_1/nothing", "/"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != http.StatusNotFound || rec.Header().Get("Allow") != "" {
			t.Errorf("GET %s: got %d with Allow %q, want 404 without Allow", path, rec.Code, rec.Header().Get("Allow"))
		}
	}
}

// TestRoutesDocumented checks that openapi.json describes exactly the
// route table.
func TestRoutesDocumented(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openapiDoc, &doc); err != nil {
		t.Fatal(err)
	}
	var documented, served []string
	for path, ops := range doc.Paths {
		for m := range ops {
			documented = append(documented, strings.ToUpper(m)+" "+path)
		}
	}
	for _, rt := range (&server{opts: Options{Metrics: NewMetrics()}}).routes() {
		served = append(served, rt.pattern)
	}
	slices.Sort(documented)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Errorf("openapi.json describes %q,\nthe server routes %q", documented, served)
	}
}
