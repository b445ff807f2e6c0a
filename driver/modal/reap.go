package modal

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stockade-sh/stockade/driver/modal/internal/pb"
	"github.com/stockade-sh/stockade/sandbox"
)

// maxPages bounds the pages of a listing Reap reads.
const maxPages = 100

// refusal tells whether err, a call's, is the service's refusal of the
// request, after which no sandbox of it exists (AlreadyExists: the name
// is another's, not this call's).
func refusal(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.AlreadyExists:
		return true
	}
	return false
}

// list calls each for the running sandboxes of app appID whose tags
// contain tags, as libmodal's Sandbox.list finds them (SandboxList page
// by page, each before the last one's creation), until each returns
// false.
func (d *Driver) list(ctx context.Context, appID string, tags []*pb.SandboxTag, each func(*pb.SandboxInfo) bool) error {
	before := 0.0
	for range maxPages {
		cctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
		resp, err := d.api.SandboxList(cctx, &pb.SandboxListRequest{AppId: appID, BeforeTimestamp: before, EnvironmentName: d.cfg.Environment, Tags: tags})
		cancel()
		if err != nil {
			return callError(ctx, "listing sandboxes", err)
		}
		infos := resp.GetSandboxes()
		if len(infos) == 0 {
			return nil
		}
		last := infos[len(infos)-1].GetCreatedAt()
		if before != 0 && !(last < before) {
			return unreadable("listing sandboxes", fmt.Errorf("a page that does not go back in time (%v, then %v)", before, last))
		}
		before = last
		for _, info := range infos {
			if !each(info) {
				return nil
			}
		}
	}
	return nil
}

// terminateNamed terminates the running sandbox named name of app appID,
// if there is one, within twice the call timeout.
func (d *Driver) terminateNamed(ctx context.Context, appID, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*d.cfg.CallTimeout)
	defer cancel()
	var found *pb.SandboxInfo
	err := d.list(ctx, appID, nil, func(info *pb.SandboxInfo) bool {
		if info.GetName() == name && checkID("sandbox id", info.GetId()) == nil {
			found = info
		}
		return found == nil
	})
	if err != nil || found == nil {
		return err
	}
	sb := &Sandbox{d: d, id: strings.TrimPrefix(name, namePrefix), sandboxID: found.GetId()}
	return sb.terminate(ctx)
}

// Reap terminates every running sandbox of the app this driver named
// whose tags contain all of match, and, when match has any, every one it
// named that has no tags and was created more than the call timeout ago:
// one whose Create lost it before tagging it (a sandbox is tagged within
// the call timeout of its creation, so another daemon's new one is not
// taken for lost). Its error joins each sandbox's, their classes kept.
func (d *Driver) Reap(ctx context.Context, match map[string]string) ([]string, error) {
	appID, err := d.app(ctx)
	if err != nil {
		return nil, err
	}
	old := float64(time.Now().Add(-d.cfg.CallTimeout).UnixNano()) / 1e9
	var reaped []string
	var errs []error
	seen := map[string]bool{}
	reap := func(info *pb.SandboxInfo) bool {
		id, ok := reapable(info, match)
		if !ok && len(match) > 0 && len(info.GetTags()) == 0 && info.GetCreatedAt() < old {
			id, ok = reapable(info, nil)
		}
		if !ok || seen[info.GetId()] {
			return true
		}
		seen[info.GetId()] = true
		sb := &Sandbox{d: d, id: id, sandboxID: info.GetId()}
		if err := sb.terminate(ctx); err != nil {
			errs = append(errs, err)
			return true
		}
		reaped = append(reaped, id)
		return true
	}
	err = d.list(ctx, appID, tagsOf(match), reap)
	if err == nil && len(match) > 0 {
		// The untagged ones, which a listing by tags leaves out.
		err = d.list(ctx, appID, nil, reap)
	}
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return reaped, fmt.Errorf("modal: reaping: %w", errors.Join(errs...))
	}
	return reaped, nil
}

// reapable returns the sandbox.ID of a listed sandbox that this driver
// named, whose ids are well-formed and whose tags contain match.
func reapable(info *pb.SandboxInfo, match map[string]string) (string, bool) {
	id, ok := strings.CutPrefix(info.GetName(), namePrefix)
	if !ok || checkID("sandbox id", info.GetId()) != nil || sandbox.CheckID(id) != nil {
		return "", false
	}
	for k, v := range match {
		if !slices.ContainsFunc(info.GetTags(), func(t *pb.SandboxTag) bool { return t.GetTagName() == k && t.GetTagValue() == v }) {
			return "", false
		}
	}
	return id, true
}
