package modal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stockade-sh/stockade/driver/modal/internal/pb"
	"github.com/stockade-sh/stockade/errdefs"
)

// The calls of the control plane's API that are not a sandbox's own:
// the client's headers and auth token, the app and the images.

// app returns the id of the driver's app, created if missing.
func (d *Driver) app(ctx context.Context) (string, error) {
	d.mu.Lock()
	id := d.appID
	d.mu.Unlock()
	if id != "" {
		return id, nil
	}
	cctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	defer cancel()
	resp, err := d.api.AppGetOrCreate(cctx, &pb.AppGetOrCreateRequest{AppName: d.cfg.App, EnvironmentName: d.cfg.Environment,
		ObjectCreationType: pb.ObjectCreationType_OBJECT_CREATION_TYPE_CREATE_IF_MISSING})
	if err != nil {
		return "", callError(ctx, "looking up the app", err)
	}
	if err := checkID("app id", resp.GetAppId()); err != nil {
		return "", unreadable("looking up the app", err)
	}
	d.mu.Lock()
	d.appID = resp.GetAppId()
	d.mu.Unlock()
	return resp.GetAppId(), nil
}

// image returns the id of the Modal image of runtime image name, built
// (or found built) from its registry image.
func (d *Driver) image(ctx context.Context, appID, name string) (string, error) {
	d.mu.Lock()
	id := d.images[name]
	d.mu.Unlock()
	if id != "" {
		return id, nil
	}
	tag := d.cfg.Images[name]
	cctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	resp, err := d.api.ImageGetOrCreate(cctx, &pb.ImageGetOrCreateRequest{AppId: appID, BuilderVersion: builderVersion,
		Image: &pb.Image{DockerfileCommands: []string{"FROM " + tag}}})
	cancel()
	if err != nil {
		return "", callError(ctx, "building image "+tag, err)
	}
	id = resp.GetImageId()
	if err := checkID("image id", id); err != nil {
		return "", unreadable("building image "+tag, err)
	}
	res := resp.GetResult()
	// Not built yet: follow the build, as the client libraries do, within
	// the start timeout.
	bctx, cancel := context.WithTimeout(ctx, d.cfg.StartTimeout)
	defer cancel()
	last := ""
	for res == nil || res.GetStatus() == pb.GenericResult_GENERIC_STATUS_UNSPECIFIED {
		if err := bctx.Err(); err != nil {
			return "", fmt.Errorf("modal: building image %s: %v: %w", tag, err, errdefs.ErrUnavailable)
		}
		res, last, err = d.joinBuild(bctx, id, last)
		if err != nil {
			return "", callError(ctx, "building image "+tag, err)
		}
	}
	if res.GetStatus() != pb.GenericResult_GENERIC_STATUS_SUCCESS {
		return "", fmt.Errorf("modal: building image %s: %s: %s: %w", tag, res.GetStatus(), clip(res.GetException()), errdefs.ErrUnavailable)
	}
	d.mu.Lock()
	d.images[name] = id
	d.mu.Unlock()
	return id, nil
}

// joinBuild follows an image's build for one stream of updates: its
// result, or nil when the stream ended without one.
func (d *Driver) joinBuild(ctx context.Context, id, last string) (*pb.GenericResult, string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := d.api.ImageJoinStreaming(ctx, &pb.ImageJoinStreamingRequest{ImageId: id, Timeout: 55, LastEntryId: last})
	if err != nil {
		return nil, last, err
	}
	for range 100000 {
		m, err := st.Recv()
		if err != nil {
			if errors.Is(err, context.Canceled) || status.Code(err) == codes.OK {
				return nil, last, nil
			}
			if errors.Is(err, io.EOF) {
				return nil, last, nil
			}
			return nil, last, err
		}
		if e := m.GetEntryId(); e != "" && len(e) <= maxString {
			last = e
		}
		if r := m.GetResult(); r != nil && r.GetStatus() != pb.GenericResult_GENERIC_STATUS_UNSPECIFIED {
			return r, last, nil
		}
	}
	return nil, last, nil
}

// unaryAuth and streamAuth put the client's headers on every call of the
// API, as the client libraries do: the token, and the auth token of
// AuthTokenGet on every call but that one.
func (d *Driver) unaryAuth(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx, err := d.outgoing(ctx, method)
	if err != nil {
		return err
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (d *Driver) streamAuth(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	ctx, err := d.outgoing(ctx, method)
	if err != nil {
		return nil, err
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// clientType is CLIENT_TYPE_LIBMODAL_GO of Modal's ClientType: the
// driver speaks the API as modal-go does.
const clientType = "9"

func (d *Driver) outgoing(ctx context.Context, method string) (context.Context, error) {
	token := ""
	if method != pb.ModalClient_AuthTokenGet_FullMethodName {
		var err error
		if token, err = d.authToken(ctx); err != nil {
			return nil, &ownError{err}
		}
	}
	ctx = metadata.AppendToOutgoingContext(ctx,
		"x-modal-client-type", clientType,
		"x-modal-client-version", "1.0.0",
		"x-modal-libmodal-version", "modal-go/stockade",
		"x-modal-token-id", d.cfg.TokenID,
		"x-modal-token-secret", d.cfg.TokenSecret)
	if token == "" {
		return ctx, nil
	}
	return metadata.AppendToOutgoingContext(ctx, "x-modal-auth-token", token), nil
}

// authToken returns the auth token, fetched again within a minute of its
// expiry.
func (d *Driver) authToken(ctx context.Context) (string, error) {
	d.mu.Lock()
	token, expires := d.token, d.expires
	d.mu.Unlock()
	if token != "" && time.Until(expires) > time.Minute {
		return token, nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	defer cancel()
	resp, err := d.api.AuthTokenGet(ctx, &pb.AuthTokenGetRequest{})
	if err != nil {
		return "", rpcError("getting an auth token", err)
	}
	token = resp.GetToken()
	exp, err := tokenExpiry(token)
	if err != nil {
		return "", unreadable("getting an auth token", err)
	}
	d.mu.Lock()
	d.token, d.expires = token, exp
	d.mu.Unlock()
	return token, nil
}
