package sqlstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// CreateWorkspace implements store.Workspaces.
func (s *Store) CreateWorkspace(ctx context.Context, name string, audit func(model.Workspace) []model.NewEvent) (model.Workspace, error) {
	if err := checkRequired("workspace name", name, 128); err != nil {
		return model.Workspace{}, fmt.Errorf("creating workspace: %w", err)
	}
	w := model.Workspace{ID: newID("ws"), Name: name, CreatedAt: s.clock()}
	p, err := normalisePolicy(model.DefaultPolicy())
	if err != nil {
		return model.Workspace{}, err
	}
	err = s.inTx(ctx, func(q Querier) error {
		if _, err := q.Exec(ctx, `INSERT INTO workspaces (id, name, created_at) VALUES ($1, $2, $3)`,
			w.ID, w.Name, s.tm(w.CreatedAt)); err != nil {
			return err
		}
		if err := s.writePolicy(ctx, q, w.ID, p, w.CreatedAt, true); err != nil {
			return err
		}
		if _, err := q.Exec(ctx, `INSERT INTO credit_accounts (workspace_id, available, reserved) VALUES ($1, 0, 0)`, w.ID); err != nil {
			return err
		}
		_, err := q.Exec(ctx, `INSERT INTO audit_chain_heads (workspace_id, seq, hash) VALUES ($1, 0, '')`, w.ID)
		if err != nil || audit == nil {
			return err
		}
		return s.appendAudit(ctx, q, w.ID, audit(w))
	})
	if errdefs.IsConflict(err) {
		// The name is the only unique value of the row the caller chose;
		// the database's own words name a constraint.
		return model.Workspace{}, errdefs.Publicf("workspace %q already exists: %w", name, errdefs.ErrConflict)
	}
	if err != nil {
		return model.Workspace{}, fmt.Errorf("creating workspace %q: %w", name, err)
	}
	return w, nil
}

const workspaceCols = `id, name, created_at`

func scanWorkspace(r Row) (model.Workspace, error) {
	var w model.Workspace
	err := r.Scan(&w.ID, &w.Name, scanTime(&w.CreatedAt))
	return w, err
}

// GetWorkspace implements store.Workspaces.
func (s *Store) GetWorkspace(ctx context.Context, id string) (model.Workspace, error) {
	w, err := scanWorkspace(lookupRow(ctx, s.b.Reader(), id, `SELECT `+workspaceCols+` FROM workspaces WHERE id = $1`, id))
	if err != nil {
		return model.Workspace{}, s.missing(err, "workspace", id)
	}
	return w, nil
}

// GetWorkspaceByName implements store.Workspaces.
func (s *Store) GetWorkspaceByName(ctx context.Context, name string) (model.Workspace, error) {
	w, err := scanWorkspace(lookupRow(ctx, s.b.Reader(), name, `SELECT `+workspaceCols+` FROM workspaces WHERE name = $1`, name))
	if err != nil {
		return model.Workspace{}, s.missing(err, "workspace named", name)
	}
	return w, nil
}

// ListWorkspaces implements store.Workspaces.
func (s *Store) ListWorkspaces(ctx context.Context) ([]model.Workspace, error) {
	ws, err := queryAll(ctx, s.b.Reader(), scanWorkspace, `SELECT `+workspaceCols+` FROM workspaces ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("listing workspaces: %w", s.classify(err))
	}
	return ws, nil
}

// requireWorkspace returns ErrNotFound unless the workspace exists.
func requireWorkspace(ctx context.Context, q Querier, id string) error {
	var one int
	if err := q.QueryRow(ctx, `SELECT 1 FROM workspaces WHERE id = $1`, id).Scan(&one); err != nil {
		if notFound(err) == errdefs.ErrNotFound {
			return errdefs.Publicf("workspace %q not found: %w", id, errdefs.ErrNotFound)
		}
		return fmt.Errorf("workspace %q: %w", id, err)
	}
	return nil
}

// CreateAPIKey implements store.Keys.
func (s *Store) CreateAPIKey(ctx context.Context, k store.NewAPIKey) (model.APIKey, error) {
	if !k.Role.Valid() {
		return model.APIKey{}, errdefs.Publicf("creating API key: unknown role %q: %w", k.Role, errdefs.ErrInvalidArgument)
	}
	if k.Hash == (model.KeyHash{}) {
		return model.APIKey{}, errdefs.Publicf("creating API key: hash is required: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkText("key name", k.Name, maxText); err != nil {
		return model.APIKey{}, fmt.Errorf("creating API key: %w", err)
	}
	key := model.APIKey{ID: newID("key"), WorkspaceID: k.WorkspaceID, Role: k.Role, Hash: k.Hash, Name: k.Name, CreatedAt: s.clock()}
	err := s.inTx(ctx, func(q Querier) error {
		if err := requireWorkspace(ctx, q, k.WorkspaceID); err != nil {
			return err
		}
		_, err := q.Exec(ctx, `INSERT INTO api_keys (id, workspace_id, role, name, hash, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
			key.ID, key.WorkspaceID, string(key.Role), key.Name, key.Hash.String(), s.tm(key.CreatedAt))
		if err != nil || k.Audit == nil {
			return err
		}
		return s.appendAudit(ctx, q, key.WorkspaceID, k.Audit(key))
	})
	if errdefs.IsConflict(err) {
		return model.APIKey{}, errdefs.Publicf("creating %s key in workspace %q: a key with this hash exists already: %w", k.Role, k.WorkspaceID, errdefs.ErrConflict)
	}
	if err != nil {
		return model.APIKey{}, fmt.Errorf("creating %s key in workspace %q: %w", k.Role, k.WorkspaceID, err)
	}
	return key, nil
}

const keyCols = `id, workspace_id, role, name, hash, created_at, revoked_at, last_used_at`

func scanKey(r Row) (model.APIKey, error) {
	var (
		k         model.APIKey
		role, hsh string
	)
	if err := r.Scan(&k.ID, &k.WorkspaceID, &role, &k.Name, &hsh, scanTime(&k.CreatedAt), scanTime(&k.RevokedAt), scanTime(&k.LastUsedAt)); err != nil {
		return k, err
	}
	k.Role = model.Role(role)
	b, err := hex.DecodeString(hsh)
	if err != nil || len(b) != len(k.Hash) {
		return k, errdefs.Publicf("decoding hash of key %s: %w", k.ID, errdefs.ErrFailedPrecondition)
	}
	copy(k.Hash[:], b)
	return k, nil
}

// LookupAPIKey implements store.Keys.
func (s *Store) LookupAPIKey(ctx context.Context, hash model.KeyHash) (model.APIKey, error) {
	k, err := scanKey(s.b.Reader().QueryRow(ctx,
		`SELECT `+keyCols+` FROM api_keys WHERE hash = $1 AND revoked_at IS NULL`, hash.String()))
	if err != nil {
		return model.APIKey{}, fmt.Errorf("looking up API key: %w", s.classify(notFound(err)))
	}
	return k, nil
}

// GetAPIKey implements store.Keys.
func (s *Store) GetAPIKey(ctx context.Context, keyID string) (model.APIKey, error) {
	k, err := scanKey(lookupRow(ctx, s.b.Reader(), keyID, `SELECT `+keyCols+` FROM api_keys WHERE id = $1`, keyID))
	if err != nil {
		return model.APIKey{}, s.missing(err, "key", keyID)
	}
	return k, nil
}

// ListAPIKeys implements store.Keys.
func (s *Store) ListAPIKeys(ctx context.Context, workspaceID string) ([]model.APIKey, error) {
	keys, err := queryAll(ctx, s.b.Reader(), scanKey,
		`SELECT `+keyCols+` FROM api_keys WHERE workspace_id = $1 ORDER BY created_at, id`, workspaceID)
	if err != nil {
		return nil, fmt.Errorf("listing keys of workspace %q: %w", workspaceID, s.classify(err))
	}
	return keys, nil
}

// RevokeAPIKey implements store.Keys.
func (s *Store) RevokeAPIKey(ctx context.Context, workspaceID, keyID string, audit func(model.APIKey) []model.NewEvent) error {
	err := s.inTx(ctx, func(q Querier) error {
		k, err := scanKey(q.QueryRow(ctx, `SELECT `+keyCols+` FROM api_keys WHERE id = $1 AND workspace_id = $2`+s.d.ForUpdate,
			keyID, workspaceID))
		if err != nil {
			return notFound(err)
		}
		if !k.RevokedAt.IsZero() {
			return nil
		}
		k.RevokedAt = s.clock()
		if _, err := q.Exec(ctx, `UPDATE api_keys SET revoked_at = $1 WHERE id = $2`, s.tm(k.RevokedAt), keyID); err != nil || audit == nil {
			return err
		}
		return s.appendAudit(ctx, q, workspaceID, audit(k))
	})
	if err != nil {
		return fmt.Errorf("revoking key %q of workspace %q: %w", keyID, workspaceID, err)
	}
	return nil
}

// RecordKeyUses implements store.Keys.
func (s *Store) RecordKeyUses(ctx context.Context, uses map[string]time.Time) error {
	if len(uses) == 0 {
		return nil
	}
	err := s.inTx(ctx, func(q Querier) error {
		for id, at := range uses {
			t := s.tm(at)
			if _, err := q.Exec(ctx, `UPDATE api_keys SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at < $3)`,
				t, id, t); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("recording the use of %d API keys: %w", len(uses), err)
	}
	return nil
}

// normalisePolicy validates p and fills the documented meanings of zero
// fields, so that both databases store the same thing.
func normalisePolicy(p model.Policy) (model.Policy, error) {
	switch p.Approval {
	case "":
		p.Approval = model.ApprovalRequired
	case model.ApprovalRequired, model.ApprovalNone, model.ApprovalPerSession:
	default:
		return p, errdefs.Publicf("unknown approval mode %q: %w", p.Approval, errdefs.ErrInvalidArgument)
	}
	switch p.ToolChanges {
	case "":
		p.ToolChanges = model.ToolChangesFlag
	case model.ToolChangesFlag, model.ToolChangesRequireReview:
	default:
		return p, errdefs.Publicf("unknown tool change mode %q: %w", p.ToolChanges, errdefs.ErrInvalidArgument)
	}
	switch p.ForkApproval {
	case "":
		p.ForkApproval = model.ForkApprovalAnew
	case model.ForkApprovalAnew, model.ForkApprovalInherit:
	default:
		return p, errdefs.Publicf("unknown fork approval mode %q (anew or inherit): %w", p.ForkApproval, errdefs.ErrInvalidArgument)
	}
	if p.MaxTimeout < 0 {
		return p, errdefs.Publicf("negative max timeout %v: %w", p.MaxTimeout, errdefs.ErrInvalidArgument)
	}
	if p.MaxSessions < 0 || p.MaxSessions > maxSessions {
		return p, errdefs.Publicf("max sessions %d: must be in [0, %d]: %w", p.MaxSessions, maxSessions, errdefs.ErrInvalidArgument)
	}
	p.MaxTimeout = p.MaxTimeout.Truncate(time.Millisecond)
	rts := make([]string, 0, len(p.Runtimes))
	seen := map[string]bool{}
	for _, r := range p.Runtimes {
		if err := checkRequired("runtime", r, 64); err != nil {
			return p, err
		}
		if !seen[r] {
			seen[r] = true
			rts = append(rts, r)
		}
	}
	p.Runtimes = rts
	return p, nil
}

func (s *Store) writePolicy(ctx context.Context, q Querier, workspaceID string, p model.Policy, at time.Time, insert bool) error {
	rts, err := json.Marshal(p.Runtimes)
	if err != nil {
		return fmt.Errorf("encoding runtimes: %w", err)
	}
	a := []any{workspaceID, p.CodeExecution, string(p.Approval), p.NetworkAllowed, p.MaxTimeout.Milliseconds(),
		string(rts), string(p.ToolChanges), s.tm(at), p.MaxSessions, string(p.ForkApproval)}
	if insert {
		_, err = q.Exec(ctx, `INSERT INTO workspace_policies (workspace_id, code_execution, approval, network_allowed,
			max_timeout_ms, runtimes, tool_changes, updated_at, max_sessions, fork_approval)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`, a...)
		return err
	}
	n, err := q.Exec(ctx, `UPDATE workspace_policies SET code_execution = $2, approval = $3, network_allowed = $4,
		max_timeout_ms = $5, runtimes = $6, tool_changes = $7, updated_at = $8, max_sessions = $9,
		fork_approval = $10 WHERE workspace_id = $1`, a...)
	if err == nil && n == 0 {
		err = errdefs.Publicf("workspace %q not found: %w", workspaceID, errdefs.ErrNotFound)
	}
	return err
}

// GetPolicy implements store.Policies.
func (s *Store) GetPolicy(ctx context.Context, workspaceID string) (model.Policy, error) {
	var (
		p        model.Policy
		approval string
		changes  string
		fork     string
		rts      string
		maxMS    int64
	)
	err := s.b.Reader().QueryRow(ctx, `SELECT code_execution, approval, network_allowed, max_timeout_ms, runtimes,
		tool_changes, updated_at, max_sessions, fork_approval FROM workspace_policies WHERE workspace_id = $1`, workspaceID).
		Scan(&p.CodeExecution, &approval, &p.NetworkAllowed, &maxMS, &rts, &changes, scanTime(&p.UpdatedAt), &p.MaxSessions, &fork)
	if err != nil {
		return model.Policy{}, s.missing(err, "policy of workspace", workspaceID)
	}
	p.Approval = model.ApprovalMode(approval)
	p.ToolChanges = model.ToolChangeMode(changes)
	p.ForkApproval = model.ForkApprovalMode(fork)
	p.MaxTimeout = time.Duration(maxMS) * time.Millisecond
	if err := json.Unmarshal([]byte(rts), &p.Runtimes); err != nil {
		return model.Policy{}, fmt.Errorf("decoding runtimes of workspace %q: %w", workspaceID, err)
	}
	if p.Runtimes == nil {
		p.Runtimes = []string{}
	}
	return p, nil
}

// SetPolicy implements store.Policies.
func (s *Store) SetPolicy(ctx context.Context, workspaceID string, p model.Policy, audit func(model.Policy) []model.NewEvent) (model.Policy, error) {
	p, err := normalisePolicy(p)
	if err != nil {
		return model.Policy{}, fmt.Errorf("setting policy of workspace %q: %w", workspaceID, err)
	}
	p.UpdatedAt = s.clock()
	if err := s.inTx(ctx, func(q Querier) error {
		if err := s.writePolicy(ctx, q, workspaceID, p, p.UpdatedAt, false); err != nil || audit == nil {
			return err
		}
		return s.appendAudit(ctx, q, workspaceID, audit(p))
	}); err != nil {
		return model.Policy{}, fmt.Errorf("setting policy of workspace %q: %w", workspaceID, err)
	}
	return p, nil
}
