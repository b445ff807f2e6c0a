-- Sessions can be paused (store.Sessions.PauseSession): their sandbox is
-- saved to a checkpoint on disk, whose size is recorded, and gone until a
-- resume starts it again. SQLite cannot change a CHECK constraint in
-- place, so the table is rebuilt as 0003 and 0005 rebuild theirs (the
-- store runs migrations with foreign keys off and checks them all before
-- committing).

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
	UNIQUE (workspace_id, idempotency_key),
	CHECK ((state = 'ended') = (end_reason IS NOT NULL AND ended_at IS NOT NULL)),
	CHECK ((state = 'paused') = (paused_at IS NOT NULL))
) STRICT;
INSERT INTO sessions_new (id, workspace_id, key_id, tool, runtime, driver, sandbox_id, network, state, end_reason,
	approval, approval_id, approved_by, idle_timeout_ms, workspace_bytes, cells, idempotency_key, request_sha256,
	created_at, expires_at, last_active_at, ended_at)
SELECT id, workspace_id, key_id, tool, runtime, driver, sandbox_id, network, state, end_reason,
	approval, approval_id, approved_by, idle_timeout_ms, workspace_bytes, cells, idempotency_key, request_sha256,
	created_at, expires_at, last_active_at, ended_at FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_new RENAME TO sessions;
CREATE INDEX sessions_workspace ON sessions (workspace_id, created_at, id);
CREATE INDEX sessions_live ON sessions (workspace_id) WHERE state <> 'ended';
