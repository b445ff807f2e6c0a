package modal

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stockade-sh/stockade/driver/modal/internal/pb"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// FuzzTokenExpiry feeds the reader of the API's tokens (JWTs) what the
// API (or whatever answers in its place) might send: it never panics,
// and what it accepts is within its bounds.
func FuzzTokenExpiry(f *testing.F) {
	enc := base64.RawURLEncoding.EncodeToString
	for _, s := range []string{
		enc([]byte(`{}`)) + "." + enc([]byte(`{"exp":1893456000}`)) + ".sig",
		enc([]byte(`{}`)) + "." + enc([]byte(`{"sub":"x"}`)) + ".",
		"a.b.c", "a.b", "", "..", enc([]byte(`{}`)) + "." + enc([]byte(`{"exp":-1}`)) + ".s",
		enc([]byte(`{}`)) + "." + enc([]byte(`{"exp":1e300}`)) + ".s", enc([]byte(`{}`)) + "." + enc([]byte(`[]`)) + ".s",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, jwt string) {
		exp, err := tokenExpiry(jwt)
		if err != nil {
			return
		}
		if len(jwt) > maxToken || exp.Before(time.Unix(0, 0)) || exp.After(time.Unix(1<<40, 0)) {
			t.Errorf("accepted a token of %d bytes expiring %v", len(jwt), exp)
		}
	})
}

// FuzzAnswers feeds the messages the driver reads, as protobuf bytes, to
// the checks the driver makes of them: ids, exit statuses, results.
func FuzzAnswers(f *testing.F) {
	for _, m := range []proto.Message{
		&pb.SandboxCreateResponse{SandboxId: "sb-1"},
		&pb.TaskExecWaitResponse{ExitStatus: &pb.TaskExecWaitResponse_Code{Code: 3}},
		&pb.TaskExecWaitResponse{ExitStatus: &pb.TaskExecWaitResponse_Signal{Signal: 9}},
		&pb.TaskExecWaitResponse{ExitStatus: &pb.TaskExecWaitResponse_Code{Code: -5}},
		&pb.ImageGetOrCreateResponse{ImageId: "im-1", Result: &pb.GenericResult{Status: pb.GenericResult_GENERIC_STATUS_FAILURE, Exception: "x"}},
		&pb.TaskGetCommandRouterAccessResponse{Jwt: "a.b.c", Url: "https://r.modal.host:443"},
		&pb.SandboxListResponse{Sandboxes: []*pb.SandboxInfo{{Id: "sb-1", Name: "stockade-sbx-1", CreatedAt: 1, Tags: []*pb.SandboxTag{{TagName: "k", TagValue: "v"}}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var c pb.SandboxCreateResponse
		if proto.Unmarshal(b, &c) == nil && checkID("", c.GetSandboxId()) == nil {
			if id := c.GetSandboxId(); len(id) > 128 || strings.ContainsAny(id, "/. \x00") {
				t.Errorf("accepted sandbox id %q", id)
			}
		}
		var w pb.TaskExecWaitResponse
		if proto.Unmarshal(b, &w) == nil {
			if code, sig, err := exitOf(&w); err == nil && (code < -1 || code > 255 || sig < 0 || sig > 64 || (sig != 0) != (code == -1)) {
				t.Errorf("accepted exit code %d, signal %d", code, sig)
			}
		}
		var l pb.SandboxListResponse
		if proto.Unmarshal(b, &l) == nil {
			for _, info := range l.GetSandboxes() {
				if id, ok := reapable(info, map[string]string{"k": "v"}); ok && (sandbox.CheckID(id) != nil || checkID("", info.GetId()) != nil) {
					t.Errorf("reaps sandbox %q (%q)", id, info.GetId())
				}
			}
		}
		var r pb.TaskGetCommandRouterAccessResponse
		if proto.Unmarshal(b, &r) == nil {
			if _, _, err := dialTarget(r.GetUrl()); err == nil && !strings.HasPrefix(r.GetUrl(), "https://") && !strings.HasPrefix(r.GetUrl(), "http://") {
				t.Errorf("accepted router URL %q", r.GetUrl())
			}
		}
	})
}

// FuzzRPCError checks that the provider's error messages are kept
// within a bound, as valid UTF-8, and keep a class.
func FuzzRPCError(f *testing.F) {
	f.Add(uint32(16), "Token ID is malformed")
	f.Add(uint32(99), strings.Repeat("\xff", 5000))
	f.Fuzz(func(t *testing.T, code uint32, msg string) {
		err := rpcError("x", status.Error(codes.Code(code), msg))
		if len(err.Error()) > maxString+128 || !utf8.ValidString(err.Error()) {
			t.Errorf("an error of %d bytes", len(err.Error()))
		}
		classed := false
		for _, c := range []error{errdefs.ErrUnavailable, errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied, errdefs.ErrNotFound,
			errdefs.ErrInvalidArgument, errdefs.ErrConflict, errdefs.ErrFailedPrecondition, errdefs.ErrResourceExhausted} {
			classed = classed || errors.Is(err, c)
		}
		if !classed {
			t.Errorf("an error of no class: %v", err)
		}
	})
}
