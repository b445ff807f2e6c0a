-- Stateful sessions (store.Sessions): a session is a grant of many cells in
-- one sandbox, and each cell an execution with its session and number.
-- The workspace policy gains the approval mode per_session and a bound on
-- live sessions; SQLite cannot change a CHECK constraint in place, so the
-- policy table is rebuilt (see 0003).

CREATE TABLE workspace_policies_new (
	workspace_id    TEXT PRIMARY KEY REFERENCES workspaces (id),
	code_execution  INTEGER NOT NULL CHECK (code_execution IN (0, 1)),
	approval        TEXT NOT NULL CHECK (approval IN ('required', 'none', 'per_session')),
	network_allowed INTEGER NOT NULL CHECK (network_allowed IN (0, 1)),
	max_timeout_ms  INTEGER NOT NULL CHECK (max_timeout_ms >= 0),
	runtimes        TEXT NOT NULL,
	tool_changes    TEXT NOT NULL CHECK (tool_changes IN ('flag', 'require_review')),
	updated_at      INTEGER NOT NULL,
	max_sessions    INTEGER NOT NULL DEFAULT 0 CHECK (max_sessions >= 0)
) STRICT;
INSERT INTO workspace_policies_new (workspace_id, code_execution, approval, network_allowed, max_timeout_ms,
	runtimes, tool_changes, updated_at)
SELECT workspace_id, code_execution, approval, network_allowed, max_timeout_ms, runtimes, tool_changes, updated_at
FROM workspace_policies;
DROP TABLE workspace_policies;
ALTER TABLE workspace_policies_new RENAME TO workspace_policies;

CREATE TABLE sessions (
	id              TEXT PRIMARY KEY,
	workspace_id    TEXT NOT NULL REFERENCES workspaces (id),
	key_id          TEXT NOT NULL REFERENCES api_keys (id),
	tool            TEXT NOT NULL,
	runtime         TEXT NOT NULL,
	driver          TEXT NOT NULL,
	sandbox_id      TEXT NOT NULL,
	network         INTEGER NOT NULL CHECK (network IN (0, 1)),
	state           TEXT NOT NULL CHECK (state IN ('active', 'ended')),
	end_reason      TEXT CHECK (end_reason IN ('closed', 'idle_timeout', 'ttl', 'interrupted', 'failed')),
	approval        TEXT NOT NULL CHECK (approval IN ('required', 'none', 'per_session')),
	approval_id     TEXT REFERENCES approval_requests (id),
	approved_by     TEXT,
	idle_timeout_ms INTEGER NOT NULL CHECK (idle_timeout_ms > 0),
	workspace_bytes INTEGER NOT NULL CHECK (workspace_bytes >= 0),
	cells           INTEGER NOT NULL DEFAULT 0 CHECK (cells >= 0),
	idempotency_key TEXT,
	request_sha256  TEXT NOT NULL,
	created_at      INTEGER NOT NULL,
	expires_at      INTEGER NOT NULL,
	last_active_at  INTEGER NOT NULL,
	ended_at        INTEGER,
	UNIQUE (workspace_id, idempotency_key),
	CHECK ((state = 'ended') = (end_reason IS NOT NULL AND ended_at IS NOT NULL))
) STRICT;
CREATE INDEX sessions_workspace ON sessions (workspace_id, created_at, id);
CREATE INDEX sessions_active ON sessions (workspace_id) WHERE state = 'active';

ALTER TABLE executions ADD COLUMN session_id TEXT REFERENCES sessions (id);
ALTER TABLE executions ADD COLUMN cell INTEGER CHECK (cell > 0);
CREATE UNIQUE INDEX executions_session_cell ON executions (session_id, cell) WHERE session_id IS NOT NULL;
