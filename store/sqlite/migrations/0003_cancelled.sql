-- Executions and approval requests can end cancelled (CancelExecution).
-- SQLite cannot change a CHECK constraint in place, so both tables are
-- rebuilt as its documentation describes (ALTER TABLE, "Making Other Kinds
-- Of Table Schema Changes"): the store runs migrations with foreign keys
-- off and checks them all before committing.

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
	UNIQUE (workspace_id, idempotency_key)
) STRICT;
INSERT INTO executions_new (id, workspace_id, key_id, status, runtime, tool, request, result, idempotency_key,
	input_sha256, reservation_id, approval_id, driver, created_at, started_at, finished_at)
SELECT id, workspace_id, key_id, status, runtime, tool, request, result, idempotency_key,
	input_sha256, reservation_id, approval_id, driver, created_at, started_at, finished_at FROM executions;
DROP TABLE executions;
ALTER TABLE executions_new RENAME TO executions;
CREATE INDEX executions_workspace ON executions (workspace_id, created_at, id);
CREATE INDEX executions_live ON executions (status) WHERE status IN ('queued', 'running');

CREATE TABLE approval_requests_new (
	id           TEXT PRIMARY KEY,
	execution_id TEXT NOT NULL UNIQUE REFERENCES executions (id),
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	status       TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired', 'cancelled')),
	card         TEXT NOT NULL,
	requested_at INTEGER NOT NULL,
	expires_at   INTEGER NOT NULL,
	decided_by   TEXT REFERENCES api_keys (id),
	decided_at   INTEGER,
	reason       TEXT NOT NULL DEFAULT ''
) STRICT;
INSERT INTO approval_requests_new (id, execution_id, workspace_id, status, card, requested_at, expires_at,
	decided_by, decided_at, reason)
SELECT id, execution_id, workspace_id, status, card, requested_at, expires_at,
	decided_by, decided_at, reason FROM approval_requests;
DROP TABLE approval_requests;
ALTER TABLE approval_requests_new RENAME TO approval_requests;
CREATE INDEX approval_requests_workspace ON approval_requests (workspace_id, requested_at, id);
CREATE INDEX approval_requests_pending ON approval_requests (expires_at) WHERE status = 'pending';
