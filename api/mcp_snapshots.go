package api

import (
	"context"

	"github.com/stockade-sh/stockade/mcp"
	"github.com/stockade-sh/stockade/wire"
)

var _ mcp.SnapshotBackend = localBackend{}

func (b localBackend) SnapshotSession(ctx context.Context, id string, req wire.SnapshotRequest) (*wire.Snapshot, error) {
	sn, stall, err := b.s.svc.SnapshotSession(ctx, b.p, id, req)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	v := snapshotView(sn, stall)
	return &v, nil
}

func (b localBackend) ForkSession(ctx context.Context, id string, req wire.ForkRequest) (*wire.Fork, error) {
	f, err := b.s.svc.ForkSession(ctx, b.p, id, req)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	out := wire.Fork{SourceID: f.Source.ID, SnapshotID: f.SnapshotID, StallMS: f.Stall.Milliseconds(), Sessions: []wire.Session{}}
	for _, ss := range f.Sessions {
		out.Sessions = append(out.Sessions, b.s.sessionView(ss))
	}
	return &out, nil
}

func (b localBackend) PauseSession(ctx context.Context, id string) (*wire.Session, error) {
	ss, err := b.s.svc.PauseSession(ctx, b.p, id)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	v := b.s.sessionView(ss)
	return &v, nil
}

func (b localBackend) ResumeSession(ctx context.Context, id string) (*wire.Session, error) {
	ss, err := b.s.svc.ResumeSession(ctx, b.p, id)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	v := b.s.sessionView(ss)
	return &v, nil
}

var _ mcp.TemplateBackend = localBackend{}

func (b localBackend) Templates(ctx context.Context) ([]wire.Template, error) {
	list, err := b.s.templateList(b.p)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	return list, nil
}
