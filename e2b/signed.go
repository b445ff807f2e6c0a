package e2b

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxSignedSandboxes bounds the running sandboxes a signed URL is
// checked against.
const maxSignedSandboxes = 1000

// signedFiles serves the URLs of the SDKs' downloadUrl() and uploadUrl():
// GET and POST /files with a signature and no sandbox id (the SDK drops
// the sandbox URL's headers and path). The signature is envd's (v1_ and
// the base64 SHA-256 of path:operation:user:token[:expiration]); the
// sandbox is the running one whose access token makes it. A bad or
// expired signature is 401.
func (s *Server) signedFiles(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sig, ok := strings.CutPrefix(q.Get("signature"), "v1_")
	if !ok || sig == "" || len(sig) > 64 {
		writeError(w, http.StatusUnauthorized, "/files without a sandbox needs a signed URL (the SDK's downloadUrl or uploadUrl)")
		return
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":"
	exp := q.Get("signature_expiration")
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Unix(n, 0).Before(s.o.Now()) {
			writeError(w, http.StatusUnauthorized, "the signed URL has expired")
			return
		}
	}
	recs, err := s.st.DueE2BSandboxes(r.Context(), s.o.Now().AddDate(100, 0, 0), maxSignedSandboxes)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	for _, rec := range recs {
		msg := raw + s.accessToken(rec.SessionID)
		if exp != "" {
			msg += ":" + exp
		}
		sum := sha256.Sum256([]byte(msg))
		want := strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
		if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
			continue
		}
		t, status, m := s.targetOf(r, rec)
		if status != 0 {
			writeError(w, status, m)
			return
		}
		ctx, detach := s.procs.attach(r.Context(), rec.SessionID)
		defer detach()
		r = r.WithContext(WithTarget(ctx, t))
		if op == "read" {
			s.download(w, r)
		} else {
			s.upload(w, r)
		}
		return
	}
	writeError(w, http.StatusUnauthorized, "the URL's signature matches no running sandbox")
}
