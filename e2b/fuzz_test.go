package e2b

import (
	"bytes"
	"io"
	"mime/multipart"
	"strings"
	"testing"
)

// FuzzReadEnvelope feeds the Connect envelope decoder what a client
// sends: it returns a message of at most its bound, or an rpcError, and
// never reads past the envelope it decodes.
func FuzzReadEnvelope(f *testing.F) {
	f.Add(appendEnvelope(nil, 0, []byte(`{"process":{"cmd":"/bin/true"}}`)))
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 1, 'x'})
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{2, 0, 0, 0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		const max = 1 << 10
		r := bytes.NewReader(b)
		msg, err := readEnvelope(r, max)
		if err != nil {
			if _, ok := err.(*rpcError); !ok {
				t.Fatalf("error %T %v, want an rpcError", err, err)
			}
			return
		}
		if len(msg) > max {
			t.Fatalf("a message of %d bytes past the bound %d", len(msg), max)
		}
		if got := len(b) - r.Len(); got != 5+len(msg) {
			t.Fatalf("read %d bytes for an envelope of %d", got, 5+len(msg))
		}
		if !bytes.Equal(appendEnvelope(nil, b[0], msg), b[:5+len(msg)]) {
			t.Fatal("the envelope does not round-trip")
		}
	})
}

// FuzzSandboxPath checks that every path the wire accepts lands in the
// writable tree and maps back to the client's prefix.
func FuzzSandboxPath(f *testing.F) {
	for _, s := range []string{"a.txt", "/home/user/a", "~/x/../y", "/workspace", "/etc/passwd", "/home/userx", "", "\x00", "~", "/home/user/./a//b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		inner, prefix, err := sandboxPath(p)
		if err != nil {
			return
		}
		if inner != workspaceDir && !strings.HasPrefix(inner, workspaceDir+"/") {
			t.Fatalf("%q maps to %q, outside %s", p, inner, workspaceDir)
		}
		if strings.Contains(inner, "/../") || strings.HasSuffix(inner, "/..") || strings.ContainsRune(inner, 0) {
			t.Fatalf("%q maps to %q", p, inner)
		}
		out := clientPath(inner, prefix)
		if back, _, err := sandboxPath(out); err != nil || back != inner {
			t.Fatalf("%q → %q → %q → %q, %v", p, inner, out, back, err)
		}
	})
}

// FuzzMultipartUpload feeds the multipart reader of POST /files a body:
// it hands at most maxUploadParts files on, each read to its end or
// refused, and returns without hanging.
func FuzzMultipartUpload(f *testing.F) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	_ = w.SetBoundary("fuzzboundary")
	p, _ := w.CreateFormFile("file", "dir/a.txt")
	_, _ = p.Write([]byte("hello"))
	_ = w.Close()
	f.Add(b.Bytes(), "")
	f.Add([]byte("--fuzzboundary\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nx\r\n--fuzzboundary--\r\n"), "q.txt")
	f.Add([]byte("--fuzzboundary--"), "")
	f.Fuzz(func(t *testing.T, body []byte, query string) {
		s := &Server{}
		n := 0
		err := s.multipartUpload(bytes.NewReader(body), "fuzzboundary", query, func(path string, r io.Reader) error {
			n++
			_, err := io.Copy(io.Discard, io.LimitReader(r, 1<<20))
			return err
		})
		if n > maxUploadParts {
			t.Fatalf("%d files handed on, more than %d", n, maxUploadParts)
		}
		if err == nil && n == 0 {
			t.Fatal("success with no file")
		}
	})
}
