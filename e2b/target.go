// Package e2b serves the wire of E2B's SDKs (the control plane, envd and
// the code interpreter) over Stockade's capability layer: an E2B sandbox
// is a Stockade session, and each command or code cell is a cell of it
// (see docs/design.md, "E2B compatibility").
package e2b

import (
	"context"
	"io"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// Target is the sandbox a data-plane request is for, resolved by the
// router from E2b-Sandbox-Id (and the access token where the SDK sends
// one).
type Target struct {
	SandboxID string               // the E2B id the SDK knows
	SessionID string               // the Stockade session behind it
	Principal capability.Principal // who created it (its agent key)
	Runtime   string               // the session's runtime ("python", ...)
	// Envs is the environment the sandbox was created with (envVars),
	// which its commands and cells get.
	Envs map[string]string
}

type targetKey struct{}

// WithTarget returns ctx carrying t.
func WithTarget(ctx context.Context, t Target) context.Context {
	return context.WithValue(ctx, targetKey{}, t)
}

// TargetFrom returns the Target the router put in ctx, if any.
func TargetFrom(ctx context.Context) (Target, bool) {
	t, ok := ctx.Value(targetKey{}).(Target)
	return t, ok
}

// Cells is what both planes need of the capability layer: a subset of
// *capability.Service, so that tests may stand in for it.
type Cells interface {
	Authenticate(ctx context.Context, key string) (capability.Principal, error)

	CreateSession(ctx context.Context, p capability.Principal, req capability.CreateSessionRequest, o capability.CreateSessionOptions) (*capability.Created, error)
	GetSession(ctx context.Context, p capability.Principal, id string) (model.Session, error)
	ListSessions(ctx context.Context, p capability.Principal, f store.SessionFilter) (store.Page[model.Session], error)
	CloseSession(ctx context.Context, p capability.Principal, id string) (model.Session, error)
	PauseSession(ctx context.Context, p capability.Principal, id string) (model.Session, error)
	ResumeSession(ctx context.Context, p capability.Principal, id string) (model.Session, error)

	// ExecCell admits a cell in the session's kernel; Wait and Subscribe
	// follow it, InterruptCell interrupts it.
	ExecCell(ctx context.Context, p capability.Principal, id string, req capability.CellRequest, o capability.InvokeOptions) (*capability.Invocation, error)
	InterruptCell(ctx context.Context, p capability.Principal, id string) (bool, error)
	Wait(ctx context.Context, p capability.Principal, id string, d time.Duration) (model.Execution, error)
	Subscribe(id string) (<-chan capability.StreamEvent, func())
	Cancel(ctx context.Context, p capability.Principal, id, reason string) (model.Execution, error)

	PutFile(ctx context.Context, p capability.Principal, id, path string, r io.Reader) (capability.FileInfo, error)
	GetFile(ctx context.Context, p capability.Principal, id, path string) ([]byte, capability.FileInfo, error)
	ListFiles(ctx context.Context, p capability.Principal, id, path string) ([]sandbox.FileInfo, bool, error)
	RemoveFile(ctx context.Context, p capability.Principal, id, path string) error
}

var _ Cells = (*capability.Service)(nil)
