package e2b

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

// FuzzDecodeExecute feeds the decoder of POST /execute arbitrary bodies:
// it never panics; it decodes a request whose names are bounded and
// whose cell, in any context, carries the code intact, or it refuses the
// body as bad input with a message a client may read.
func FuzzDecodeExecute(f *testing.F) {
	for _, s := range []string{
		`{"code":"x + 1"}`, `{"code":"1","context_id":null,"language":null,"env_vars":null}`,
		`{"code":"echo $A","language":"bash","env_vars":{"A":"1"}}`, `{"code":"1","context_id":"python","language":"python"}`,
		`{"code":"\u0000\"'''\\"}`, `{"code":1}`, `{"env_vars":{"1A":"x"}}`, `{}{}`, ``, `[`, "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		req, err := ciDecodeExecute(http.MaxBytesReader(w, io.NopCloser(bytes.NewReader(body)), ciMaxExecuteBody))
		if err != nil {
			if !errdefs.IsInvalidArgument(err) && !errdefs.IsTooLarge(err) {
				t.Fatalf("body %q: got %v, want a request or bad input", body, err)
			}
			if _, ok := errdefs.PublicMessage(err); !ok {
				t.Fatalf("body %q: the error %v is not one a client may read", body, err)
			}
			return
		}
		if req.ContextID != "" && req.Language != "" {
			t.Fatalf("body %q: both a context and a language", body)
		}
		for k := range req.EnvVars {
			if !ciEnvName(k) {
				t.Fatalf("body %q: accepted the variable %q", body, k)
			}
		}
		// The cell carries the code as a literal that reads back as it.
		cell := ciHelperCell(&ciContext{ID: "ctx_1", Language: "bash", Cwd: "/tmp"}, req.Code, req.EnvVars, false, nil)
		lit := ciPyString(req.Code)
		if !strings.Contains(cell, lit) || strings.Contains(lit, "\n") {
			t.Fatalf("body %q: the code's literal %q is not one line of the cell", body, lit)
		}
		var back string
		if err := json.Unmarshal([]byte(lit), &back); err != nil || (back != req.Code && strings.ToValidUTF8(req.Code, "\uFFFD") != back) {
			t.Fatalf("body %q: the literal %q reads back as %q, %v", body, lit, back, err)
		}
	})
}
