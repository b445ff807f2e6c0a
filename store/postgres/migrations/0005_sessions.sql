-- Stateful sessions (store.Sessions): a session is a grant of many cells in
-- one sandbox, and each cell an execution with its session and number.
-- The workspace policy gains the approval mode per_session and a bound on
-- live sessions.

ALTER TABLE workspace_policies DROP CONSTRAINT workspace_policies_approval_check;
ALTER TABLE workspace_policies ADD CONSTRAINT workspace_policies_approval_check
	CHECK (approval IN ('required', 'none', 'per_session'));
ALTER TABLE workspace_policies ADD COLUMN max_sessions INTEGER NOT NULL DEFAULT 0 CHECK (max_sessions >= 0);

CREATE TABLE sessions (
	id              TEXT PRIMARY KEY,
	workspace_id    TEXT NOT NULL REFERENCES workspaces (id),
	key_id          TEXT NOT NULL REFERENCES api_keys (id),
	tool            TEXT NOT NULL,
	runtime         TEXT NOT NULL,
	driver          TEXT NOT NULL,
	sandbox_id      TEXT NOT NULL,
	network         BOOLEAN NOT NULL,
	state           TEXT NOT NULL CHECK (state IN ('active', 'ended')),
	end_reason      TEXT CHECK (end_reason IN ('closed', 'idle_timeout', 'ttl', 'interrupted', 'failed')),
	approval        TEXT NOT NULL CHECK (approval IN ('required', 'none', 'per_session')),
	approval_id     TEXT REFERENCES approval_requests (id),
	approved_by     TEXT,
	idle_timeout_ms BIGINT NOT NULL CHECK (idle_timeout_ms > 0),
	workspace_bytes BIGINT NOT NULL CHECK (workspace_bytes >= 0),
	cells           INTEGER NOT NULL DEFAULT 0 CHECK (cells >= 0),
	idempotency_key TEXT,
	request_sha256  TEXT NOT NULL,
	created_at      TIMESTAMPTZ NOT NULL,
	expires_at      TIMESTAMPTZ NOT NULL,
	last_active_at  TIMESTAMPTZ NOT NULL,
	ended_at        TIMESTAMPTZ,
	UNIQUE (workspace_id, idempotency_key),
	CHECK ((state = 'ended') = (end_reason IS NOT NULL AND ended_at IS NOT NULL))
);
CREATE INDEX sessions_workspace ON sessions (workspace_id, created_at, id);
CREATE INDEX sessions_active ON sessions (workspace_id) WHERE state = 'active';

ALTER TABLE executions ADD COLUMN session_id TEXT REFERENCES sessions (id);
ALTER TABLE executions ADD COLUMN cell INTEGER CHECK (cell > 0);
CREATE UNIQUE INDEX executions_session_cell ON executions (session_id, cell) WHERE session_id IS NOT NULL;
