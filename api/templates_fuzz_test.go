package api

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/errdefs"
)

// FuzzDecodeBuildRequest feeds the decoder of POST
// /v1/templates/{name}/builds arbitrary bodies: it must never panic, and
// it either decodes a request or refuses the body as bad input.
func FuzzDecodeBuildRequest(f *testing.F) {
	for _, s := range []string{`{"pull":true}`, `{}`, `{"pull":1}`, `{"pull":false,"x":1}`, `{"pull":true}{}`, ``, `[`, "\x00"} {
		f.Add([]byte(s))
	}
	s := &server{}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req client.BuildRequest
		r := httptest.NewRequest("POST", "/v1/templates/analytics/builds", bytes.NewReader(body))
		err := s.decodeBody(httptest.NewRecorder(), r, &req)
		if err != nil && !errdefs.IsInvalidArgument(err) && !errdefs.IsTooLarge(err) {
			t.Fatalf("body %q: got %v, want a decoded request or bad input", body, err)
		}
		if _, ok := errdefs.PublicMessage(err); err != nil && !ok {
			t.Fatalf("body %q: the error %v is not one a client may read", body, err)
		}
	})
}
