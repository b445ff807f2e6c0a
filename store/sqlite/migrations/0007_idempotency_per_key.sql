-- Idempotency keys are scoped to the API key that sent them, not to its
-- workspace: another key of the workspace that reuses one starts its own
-- request instead of being answered with the first key's. Rows that
-- exist keep their keys: two keys of one workspace never shared one.
-- SQLite cannot change a UNIQUE constraint in place, so both tables are
-- rebuilt as 0003 and 0006 rebuild theirs (the store runs migrations with
-- foreign keys off and checks them all before committing).

CREATE TABLE executions_new (
	id              TEXT PRIMARY KEY,
	workspace_id    TEXT NOT NULL REFERENCES workspaces (id),
	key_id          TEXT NOT NULL REFERENCES api_keys (id),
	status          TEXT NOT NULL CHECK (status IN ('queued', 'awaiting_approval', 'running', 'succeeded', 'failed',
		'timed_out', 'oom_killed', 'killed', 'denied', 'approval_expired', 'launch_failed', 'cancelled')),
	runtime         TEXT NOT NULL,
	tool            TEXT NOT NULL,
	request         TEXT NOT NULL,
	result          TEXT,
	idempotency_key TEXT,
	input_sha256    TEXT NOT NULL,
	reservation_id  TEXT,
	approval_id     TEXT,
	driver          TEXT NOT NULL DEFAULT '',
	created_at      INTEGER NOT NULL,
	started_at      INTEGER,
	finished_at     INTEGER,
	session_id      TEXT REFERENCES sessions (id),
	cell            INTEGER CHECK (cell > 0),
	UNIQUE (key_id, idempotency_key)
) STRICT;
INSERT INTO executions_new (id, workspace_id, key_id, status, runtime, tool, request, result, idempotency_key,
	input_sha256, reservation_id, approval_id, driver, created_at, started_at, finished_at, session_id, cell)
SELECT id, workspace_id, key_id, status, runtime, tool, request, result, idempotency_key,
	input_sha256, reservation_id, approval_id, driver, created_at, started_at, finished_at, session_id, cell FROM executions;
DROP TABLE executions;
ALTER TABLE executions_new RENAME TO executions;
CREATE INDEX executions_workspace ON executions (workspace_id, created_at, id);
CREATE INDEX executions_live ON executions (status) WHERE status IN ('queued', 'running');
CREATE UNIQUE INDEX executions_session_cell ON executions (session_id, cell) WHERE session_id IS NOT NULL;

CREATE TABLE sessions_new (
	id               TEXT PRIMARY KEY,
	workspace_id     TEXT NOT NULL REFERENCES workspaces (id),
	key_id           TEXT NOT NULL REFERENCES api_keys (id),
	tool             TEXT NOT NULL,
	runtime          TEXT NOT NULL,
	driver           TEXT NOT NULL,
	sandbox_id       TEXT NOT NULL,
	network          INTEGER NOT NULL CHECK (network IN (0, 1)),
	state            TEXT NOT NULL CHECK (state IN ('active', 'paused', 'ended')),
	end_reason       TEXT CHECK (end_reason IN ('closed', 'idle_timeout', 'ttl', 'interrupted', 'failed')),
	approval         TEXT NOT NULL CHECK (approval IN ('required', 'none', 'per_session')),
	approval_id      TEXT REFERENCES approval_requests (id),
	approved_by      TEXT,
	idle_timeout_ms  INTEGER NOT NULL CHECK (idle_timeout_ms > 0),
	workspace_bytes  INTEGER NOT NULL CHECK (workspace_bytes >= 0),
	cells            INTEGER NOT NULL DEFAULT 0 CHECK (cells >= 0),
	idempotency_key  TEXT,
	request_sha256   TEXT NOT NULL,
	created_at       INTEGER NOT NULL,
	expires_at       INTEGER NOT NULL,
	last_active_at   INTEGER NOT NULL,
	ended_at         INTEGER,
	paused_at        INTEGER,
	checkpoint_bytes INTEGER NOT NULL DEFAULT 0 CHECK (checkpoint_bytes >= 0),
	UNIQUE (key_id, idempotency_key),
	CHECK ((state = 'ended') = (end_reason IS NOT NULL AND ended_at IS NOT NULL)),
	CHECK ((state = 'paused') = (paused_at IS NOT NULL))
) STRICT;
INSERT INTO sessions_new (id, workspace_id, key_id, tool, runtime, driver, sandbox_id, network, state, end_reason,
	approval, approval_id, approved_by, idle_timeout_ms, workspace_bytes, cells, idempotency_key, request_sha256,
	created_at, expires_at, last_active_at, ended_at, paused_at, checkpoint_bytes)
SELECT id, workspace_id, key_id, tool, runtime, driver, sandbox_id, network, state, end_reason,
	approval, approval_id, approved_by, idle_timeout_ms, workspace_bytes, cells, idempotency_key, request_sha256,
	created_at, expires_at, last_active_at, ended_at, paused_at, checkpoint_bytes FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_new RENAME TO sessions;
CREATE INDEX sessions_workspace ON sessions (workspace_id, created_at, id);
CREATE INDEX sessions_live ON sessions (workspace_id) WHERE state <> 'ended';
