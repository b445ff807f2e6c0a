package ocidriver

import (
	"context"

	"github.com/stockade-sh/stockade/sandbox"
)

// resumeGuest is Restore's resume: the guest's exec and cells that the
// saved sandbox's client left are ended (sandboxkit.Guest.Resume).
func resumeGuest(ctx context.Context, s *sbx) error {
	_, err := s.Guest.Resume(ctx)
	return err
}

// RestoreExec restores a sandbox that Checkpoint saved while a pool's
// interpreter waited in it for its program, as Restore does, and adopts
// that interpreter as the Exec of req, the request it was started with
// (sandboxkit.Guest.ResumeExec): see sandbox.ExecRestorer.
func (d *Snapshotting) RestoreExec(ctx context.Context, dir string, labels map[string]string, req sandbox.ExecRequest) (sandbox.Sandbox, sandbox.Exec, error) {
	var ex sandbox.Exec
	sb, err := d.restore(ctx, dir, labels, func(ctx context.Context, s *sbx) error {
		var err error
		ex, err = s.Guest.ResumeExec(ctx, req)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return sb, ex, nil
}
