// Package fake is a fake of Modal's gRPC API, for the modal driver's
// tests: the RPCs, fields and headers as Modal's client library
// (github.com/modal-labs/libmodal's modal-go: client.go's headers,
// auth_token_manager.go, sandbox.go, task_command_router_client.go) sends
// and reads them, each sandbox a sandbox of another driver (runc in the
// tests). It is no model of the service's isolation, limits or network:
// only of its API. Both services, the control plane's and the task
// command router's, are served on one listener.
package fake

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/stockade-sh/stockade/driver/modal/internal/pb"
	"github.com/stockade-sh/stockade/sandbox"
)

// Config configures a fake.
type Config struct {
	// TokenID and TokenSecret are the credentials the fake accepts.
	TokenID, TokenSecret string
	// Machines creates the sandbox behind each Modal sandbox.
	Machines sandbox.Driver
	// Image returns the image of a registry image's tag; an error
	// fails its build.
	Image func(tag string) (sandbox.Image, error)
	// After, when it has a method's name (as Calls has it), is called
	// after the method did its work and before it answers: an error it
	// returns is the method's answer instead (a lost answer, for the
	// tests' fault injection; it may block until ctx ends).
	After map[string]func(ctx context.Context) error
}

// Server is the fake API.
type Server struct {
	cfg  Config
	srv  *grpc.Server
	lis  net.Listener
	addr string

	mu        sync.Mutex
	seq       int
	authToken string
	apps      map[string]string // name -> id
	images    map[string]sandbox.Image
	sandboxes map[string]*msandbox // by sandbox id
	tasks     map[string]*msandbox // by task id
	calls     []string
}

// msandbox is one Modal sandbox and its task.
type msandbox struct {
	id, task, jwt string
	name, app     string
	created       float64 // seconds since the epoch, as SandboxInfo's
	tags          map[string]string
	access        *pb.NetworkAccess
	machine       sandbox.Sandbox
	timer         *time.Timer

	mu         sync.Mutex
	terminated bool
	execs      map[string]*mexec
}

// Start listens on loopback and serves.
func Start(cfg Config) (*Server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, lis: lis, addr: "http://" + lis.Addr().String(), apps: map[string]string{}, images: map[string]sandbox.Image{},
		sandboxes: map[string]*msandbox{}, tasks: map[string]*msandbox{}}
	s.srv = grpc.NewServer()
	pb.RegisterModalClientServer(s.srv, &api{s: s})
	pb.RegisterTaskCommandRouterServer(s.srv, &routerSrv{s: s})
	go s.srv.Serve(lis)
	return s, nil
}

// URL is the API's address (http on loopback).
func (s *Server) URL() string { return s.addr }

// Close stops serving and terminates every sandbox still there.
func (s *Server) Close() {
	s.srv.Stop()
	s.mu.Lock()
	all := make([]*msandbox, 0, len(s.sandboxes))
	for _, v := range s.sandboxes {
		all = append(all, v)
	}
	s.mu.Unlock()
	for _, v := range all {
		v.terminate()
	}
}

// Calls returns the methods called so far, in order.
func (s *Server) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// Running returns the ids of the sandboxes that run.
func (s *Server) Running() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, v := range s.sandboxes {
		v.mu.Lock()
		if !v.terminated {
			ids = append(ids, id)
		}
		v.mu.Unlock()
	}
	slices.Sort(ids)
	return ids
}

// Access returns the network access sandbox name (its Name) was created
// with; nil for no sandbox.
func (s *Server) Access(name string) *pb.NetworkAccess {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.sandboxes {
		if v.name == name {
			return v.access
		}
	}
	return nil
}

// Age moves the creation of every sandbox d back in time, as if it had
// been created d earlier.
func (s *Server) Age(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.sandboxes {
		v.mu.Lock()
		v.created -= d.Seconds()
		v.mu.Unlock()
	}
}

// after runs the Config.After hook of method, if any.
func (s *Server) after(ctx context.Context, method string) error {
	if h := s.cfg.After[method]; h != nil {
		return h(ctx)
	}
	return nil
}

func (s *Server) next(prefix string) string {
	s.seq++
	return fmt.Sprintf("%s-%d", prefix, s.seq)
}

// jwt makes a token as the service's: a JWT whose payload has exp.
func jwt(exp time.Time, sub string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc(fmt.Appendf(nil, `{"exp":%d,"sub":%q}`, exp.Unix(), sub)) + ".sig"
}

// check checks a control-plane call's headers, as the service would:
// the client's type and version, the token, and the auth token on every
// call but AuthTokenGet.
func (s *Server) check(ctx context.Context, method string) error {
	s.mu.Lock()
	s.calls = append(s.calls, method)
	token := s.authToken
	s.mu.Unlock()
	md, _ := metadata.FromIncomingContext(ctx)
	one := func(k string) string {
		if v := md.Get(k); len(v) == 1 {
			return v[0]
		}
		return ""
	}
	if one("x-modal-client-type") == "" || one("x-modal-client-version") == "" {
		return status.Error(codes.FailedPrecondition, "missing client type or version")
	}
	if one("x-modal-token-id") != s.cfg.TokenID || one("x-modal-token-secret") != s.cfg.TokenSecret {
		return status.Error(codes.Unauthenticated, "Token ID is malformed or invalid")
	}
	if method != "AuthTokenGet" && (token == "" || one("x-modal-auth-token") != token) {
		return status.Error(codes.Unauthenticated, "missing or invalid auth token")
	}
	return nil
}

func (v *msandbox) terminate() {
	v.mu.Lock()
	if v.terminated {
		v.mu.Unlock()
		return
	}
	v.terminated = true
	if v.timer != nil {
		v.timer.Stop()
	}
	execs := make([]*mexec, 0, len(v.execs))
	for _, e := range v.execs {
		execs = append(execs, e)
	}
	m := v.machine
	v.mu.Unlock()
	if m != nil {
		_ = m.Destroy(context.Background())
	}
	for _, e := range execs {
		e.gone()
	}
}

// api is the control plane's service.
type api struct {
	pb.UnimplementedModalClientServer
	s *Server
}

func (a *api) AuthTokenGet(ctx context.Context, _ *pb.AuthTokenGetRequest) (*pb.AuthTokenGetResponse, error) {
	if err := a.s.check(ctx, "AuthTokenGet"); err != nil {
		return nil, err
	}
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	a.s.authToken = jwt(time.Now().Add(time.Hour), a.s.next("auth"))
	return &pb.AuthTokenGetResponse{Token: a.s.authToken}, nil
}

func (a *api) AppGetOrCreate(ctx context.Context, req *pb.AppGetOrCreateRequest) (*pb.AppGetOrCreateResponse, error) {
	if err := a.s.check(ctx, "AppGetOrCreate"); err != nil {
		return nil, err
	}
	if req.GetAppName() == "" || req.GetObjectCreationType() != pb.ObjectCreationType_OBJECT_CREATION_TYPE_CREATE_IF_MISSING {
		return nil, status.Error(codes.InvalidArgument, "want an app name, created if missing")
	}
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	id := a.s.apps[req.GetAppName()]
	if id == "" {
		id = a.s.next("ap")
		a.s.apps[req.GetAppName()] = id
	}
	return &pb.AppGetOrCreateResponse{AppId: id}, nil
}

func (a *api) knownApp(id string) bool {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	for _, v := range a.s.apps {
		if v == id {
			return true
		}
	}
	return false
}

// ImageGetOrCreate starts a build: its result comes from
// ImageJoinStreaming, as for an image the service has not built yet.
func (a *api) ImageGetOrCreate(ctx context.Context, req *pb.ImageGetOrCreateRequest) (*pb.ImageGetOrCreateResponse, error) {
	if err := a.s.check(ctx, "ImageGetOrCreate"); err != nil {
		return nil, err
	}
	cmds := req.GetImage().GetDockerfileCommands()
	if !a.knownApp(req.GetAppId()) || len(cmds) != 1 || !strings.HasPrefix(cmds[0], "FROM ") || req.GetBuilderVersion() == "" {
		return nil, status.Error(codes.InvalidArgument, "want an app and one FROM line")
	}
	img, err := a.s.cfg.Image(strings.TrimPrefix(cmds[0], "FROM "))
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	id := a.s.next("im")
	a.s.images[id] = img
	return &pb.ImageGetOrCreateResponse{ImageId: id}, nil
}

func (a *api) ImageJoinStreaming(req *pb.ImageJoinStreamingRequest, st grpc.ServerStreamingServer[pb.ImageJoinStreamingResponse]) error {
	if err := a.s.check(st.Context(), "ImageJoinStreaming"); err != nil {
		return err
	}
	a.s.mu.Lock()
	_, ok := a.s.images[req.GetImageId()]
	a.s.mu.Unlock()
	if !ok {
		return status.Error(codes.NotFound, "no such image")
	}
	if err := st.Send(&pb.ImageJoinStreamingResponse{EntryId: "1-0"}); err != nil {
		return err
	}
	return st.Send(&pb.ImageJoinStreamingResponse{EntryId: "2-0", Eof: true, Result: &pb.GenericResult{Status: pb.GenericResult_GENERIC_STATUS_SUCCESS}})
}

func (a *api) SandboxCreate(ctx context.Context, req *pb.SandboxCreateRequest) (*pb.SandboxCreateResponse, error) {
	if err := a.s.check(ctx, "SandboxCreate"); err != nil {
		return nil, err
	}
	def := req.GetDefinition()
	a.s.mu.Lock()
	img, ok := a.s.images[def.GetImageId()]
	a.s.mu.Unlock()
	if !a.knownApp(req.GetAppId()) || !ok || def.GetTimeoutSecs() == 0 {
		return nil, status.Error(codes.InvalidArgument, "want an app, a built image and a timeout")
	}
	acc := def.GetNetworkAccess()
	if def.GetBlockNetwork() != (acc.GetNetworkAccessType() == pb.NetworkAccess_BLOCKED) {
		return nil, status.Error(codes.InvalidArgument, "block_network disagrees with network_access")
	}
	// The service caps no output: the machine's cap is beyond the tests'.
	lim := sandbox.Limits{CPU: float64(def.GetResources().GetMilliCpu()) / 1000, Memory: int64(def.GetResources().GetMemoryMb()) << 20, OutputCap: 64 << 20}
	m, err := a.s.cfg.Machines.Create(ctx, sandbox.Spec{Image: img, Limits: lim})
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	a.s.mu.Lock()
	v := &msandbox{id: a.s.next("sb"), task: a.s.next("ta"), name: def.GetName(), app: req.GetAppId(), access: acc, machine: m, execs: map[string]*mexec{},
		created: float64(time.Now().UnixNano()) / 1e9, tags: map[string]string{}}
	v.jwt = jwt(time.Now().Add(time.Hour), v.task)
	a.s.sandboxes[v.id] = v
	a.s.tasks[v.task] = v
	a.s.mu.Unlock()
	v.mu.Lock()
	v.timer = time.AfterFunc(time.Duration(def.GetTimeoutSecs())*time.Second, v.terminate)
	v.mu.Unlock()
	if err := a.s.after(ctx, "SandboxCreate"); err != nil {
		return nil, err
	}
	return &pb.SandboxCreateResponse{SandboxId: v.id}, nil
}

func (a *api) sandbox(id string) (*msandbox, error) {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	if v := a.s.sandboxes[id]; v != nil {
		return v, nil
	}
	return nil, status.Error(codes.NotFound, "no such sandbox")
}

func terminated() *pb.GenericResult {
	return &pb.GenericResult{Status: pb.GenericResult_GENERIC_STATUS_TERMINATED}
}

func (a *api) SandboxGetTaskId(ctx context.Context, req *pb.SandboxGetTaskIdRequest) (*pb.SandboxGetTaskIdResponse, error) {
	if err := a.s.check(ctx, "SandboxGetTaskId"); err != nil {
		return nil, err
	}
	v, err := a.sandbox(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.terminated {
		return &pb.SandboxGetTaskIdResponse{TaskResult: terminated()}, nil
	}
	return &pb.SandboxGetTaskIdResponse{TaskId: &v.task}, nil
}

func (a *api) SandboxTagsSet(ctx context.Context, req *pb.SandboxTagsSetRequest) (*emptypb.Empty, error) {
	if err := a.s.check(ctx, "SandboxTagsSet"); err != nil {
		return nil, err
	}
	v, err := a.sandbox(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, t := range req.GetTags() {
		if t.GetTagName() == "" {
			return nil, status.Error(codes.InvalidArgument, "a tag without a name")
		}
		v.tags[t.GetTagName()] = t.GetTagValue()
	}
	return &emptypb.Empty{}, nil
}

// listPage is the fake's page of SandboxList: small, so that the tests
// page.
const listPage = 2

// SandboxList lists an app's sandboxes whose tags contain the request's,
// newest first, created before before_timestamp when it is set.
func (a *api) SandboxList(ctx context.Context, req *pb.SandboxListRequest) (*pb.SandboxListResponse, error) {
	if err := a.s.check(ctx, "SandboxList"); err != nil {
		return nil, err
	}
	a.s.mu.Lock()
	all := make([]*msandbox, 0, len(a.s.sandboxes))
	for _, v := range a.s.sandboxes {
		all = append(all, v)
	}
	a.s.mu.Unlock()
	slices.SortFunc(all, func(x, y *msandbox) int { return -cmp.Compare(x.created, y.created) })
	resp := &pb.SandboxListResponse{}
next:
	for _, v := range all {
		v.mu.Lock()
		ok := v.app == req.GetAppId() && (!v.terminated || req.GetIncludeFinished()) && (req.GetBeforeTimestamp() == 0 || v.created < req.GetBeforeTimestamp())
		tags := maps.Clone(v.tags)
		v.mu.Unlock()
		if !ok {
			continue
		}
		for _, t := range req.GetTags() {
			if got, ok := tags[t.GetTagName()]; !ok || got != t.GetTagValue() {
				continue next
			}
		}
		info := &pb.SandboxInfo{Id: v.id, CreatedAt: v.created, AppId: v.app, Name: v.name}
		for _, k := range slices.Sorted(maps.Keys(tags)) {
			info.Tags = append(info.Tags, &pb.SandboxTag{TagName: k, TagValue: tags[k]})
		}
		if resp.Sandboxes = append(resp.Sandboxes, info); len(resp.Sandboxes) == listPage {
			break
		}
	}
	return resp, nil
}

func (a *api) SandboxTerminate(ctx context.Context, req *pb.SandboxTerminateRequest) (*pb.SandboxTerminateResponse, error) {
	if err := a.s.check(ctx, "SandboxTerminate"); err != nil {
		return nil, err
	}
	v, err := a.sandbox(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	v.terminate()
	return &pb.SandboxTerminateResponse{}, nil
}

// SandboxWait answers at once (the driver's timeout is 0): the result
// of an ended sandbox, none of one that runs.
func (a *api) SandboxWait(ctx context.Context, req *pb.SandboxWaitRequest) (*pb.SandboxWaitResponse, error) {
	if err := a.s.check(ctx, "SandboxWait"); err != nil {
		return nil, err
	}
	v, err := a.sandbox(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.terminated {
		return &pb.SandboxWaitResponse{Result: terminated()}, nil
	}
	return &pb.SandboxWaitResponse{}, nil
}

func (a *api) TaskGetCommandRouterAccess(ctx context.Context, req *pb.TaskGetCommandRouterAccessRequest) (*pb.TaskGetCommandRouterAccessResponse, error) {
	if err := a.s.check(ctx, "TaskGetCommandRouterAccess"); err != nil {
		return nil, err
	}
	a.s.mu.Lock()
	v := a.s.tasks[req.GetTaskId()]
	a.s.mu.Unlock()
	if v == nil {
		return nil, status.Error(codes.NotFound, "no such task")
	}
	return &pb.TaskGetCommandRouterAccessResponse{Jwt: v.jwt, Url: a.s.addr}, nil
}
