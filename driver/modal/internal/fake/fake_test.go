package fake

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stockade-sh/stockade/driver/modal/internal/pb"
)

// TestHeaders checks that the fake holds a client to the headers
// libmodal's modal-go sends (client.go's injectRequiredHeaders and
// authTokenInterceptor): the client's type and version and the token on
// every call, and the auth token of AuthTokenGet on every other one.
func TestHeaders(t *testing.T) {
	s, err := Start(Config{TokenID: "ak-1", TokenSecret: "as-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn, err := grpc.NewClient(s.lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewModalClientClient(conn)
	base := []string{"x-modal-client-type", "9", "x-modal-client-version", "1.0.0", "x-modal-token-id", "ak-1", "x-modal-token-secret", "as-1"}
	ctx := metadata.AppendToOutgoingContext(t.Context(), base...)
	tok, err := c.AuthTokenGet(ctx, &pb.AuthTokenGetRequest{})
	if err != nil {
		t.Fatalf("the control: AuthTokenGet with libmodal's headers: %v", err)
	}
	app := &pb.AppGetOrCreateRequest{AppName: "a", ObjectCreationType: pb.ObjectCreationType_OBJECT_CREATION_TYPE_CREATE_IF_MISSING}
	if _, err := c.AppGetOrCreate(metadata.AppendToOutgoingContext(ctx, "x-modal-auth-token", tok.GetToken()), app); err != nil {
		t.Fatalf("the control: AppGetOrCreate with the auth token: %v", err)
	}
	for name, md := range map[string][]string{
		"no auth token":  base,
		"no client type": append(base[2:], "x-modal-auth-token", tok.GetToken()),
		"wrong secret":   append(append(base[:6:6], "x-modal-token-secret", "x", "x-modal-auth-token"), tok.GetToken()),
	} {
		_, err := c.AppGetOrCreate(metadata.AppendToOutgoingContext(t.Context(), md...), app)
		if code := status.Code(err); code != codes.Unauthenticated && code != codes.FailedPrecondition {
			t.Errorf("%s: got %v, want a refusal", name, err)
		}
	}
}
