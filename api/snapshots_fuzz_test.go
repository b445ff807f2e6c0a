package api

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/wire"
)

// FuzzDecodeForkRequest feeds the decoders of POST
// /v1/sessions/{id}/fork and /snapshots arbitrary bodies: they must never
// panic, and each either decodes a request or refuses the body as bad
// input a client may read.
func FuzzDecodeForkRequest(f *testing.F) {
	for _, s := range []string{`{"count":4}`, `{"count":0}`, `{"count":-1,"ttl_ms":5}`, `{"count":1e99}`, `{"name":"x"}`, `{"name":1}`, `{}{}`, ``, `[`, "\x00"} {
		f.Add([]byte(s))
	}
	s := &server{}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, v := range []any{&wire.ForkRequest{}, &wire.SnapshotRequest{}} {
			r := httptest.NewRequest("POST", "/v1/sessions/ses_1/fork", bytes.NewReader(body))
			err := s.decodeBody(httptest.NewRecorder(), r, v)
			if err != nil && !errdefs.IsInvalidArgument(err) && !errdefs.IsTooLarge(err) {
				t.Fatalf("body %q into %T: got %v, want a decoded request or bad input", body, v, err)
			}
			if _, ok := errdefs.PublicMessage(err); err != nil && !ok {
				t.Fatalf("body %q into %T: the error %v is not one a client may read", body, v, err)
			}
		}
	})
}
