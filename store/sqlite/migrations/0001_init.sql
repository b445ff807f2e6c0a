-- The capability layer's schema. Times are INTEGER microseconds since the
-- Unix epoch (UTC); booleans are 0 or 1. Tables are STRICT so that a value of
-- the wrong type is refused rather than stored.

CREATE TABLE workspaces (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL UNIQUE,
	created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE api_keys (
	id           TEXT PRIMARY KEY,
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	role         TEXT NOT NULL CHECK (role IN ('agent', 'approver', 'admin')),
	name         TEXT NOT NULL DEFAULT '',
	hash         TEXT NOT NULL UNIQUE,
	created_at   INTEGER NOT NULL,
	revoked_at   INTEGER
) STRICT;
CREATE INDEX api_keys_workspace ON api_keys (workspace_id, created_at);

CREATE TABLE workspace_policies (
	workspace_id    TEXT PRIMARY KEY REFERENCES workspaces (id),
	code_execution  INTEGER NOT NULL CHECK (code_execution IN (0, 1)),
	approval        TEXT NOT NULL CHECK (approval IN ('required', 'none')),
	network_allowed INTEGER NOT NULL CHECK (network_allowed IN (0, 1)),
	max_timeout_ms  INTEGER NOT NULL CHECK (max_timeout_ms >= 0),
	runtimes        TEXT NOT NULL,
	tool_changes    TEXT NOT NULL CHECK (tool_changes IN ('flag', 'require_review')),
	updated_at      INTEGER NOT NULL
) STRICT;

CREATE TABLE credit_accounts (
	workspace_id TEXT PRIMARY KEY REFERENCES workspaces (id),
	available    INTEGER NOT NULL CHECK (available >= 0),
	reserved     INTEGER NOT NULL CHECK (reserved >= 0)
) STRICT;

CREATE TABLE credit_ledger (
	id             TEXT PRIMARY KEY,
	workspace_id   TEXT NOT NULL REFERENCES workspaces (id),
	kind           TEXT NOT NULL CHECK (kind IN ('grant', 'reserve', 'commit', 'release')),
	amount         INTEGER NOT NULL CHECK (amount > 0),
	reservation_id TEXT,
	execution_id   TEXT,
	note           TEXT NOT NULL DEFAULT '',
	created_at     INTEGER NOT NULL
) STRICT;
CREATE INDEX credit_ledger_workspace ON credit_ledger (workspace_id, created_at, id);

CREATE TABLE executions (
	id              TEXT PRIMARY KEY,
	workspace_id    TEXT NOT NULL REFERENCES workspaces (id),
	key_id          TEXT NOT NULL REFERENCES api_keys (id),
	status          TEXT NOT NULL CHECK (status IN ('queued', 'awaiting_approval', 'running', 'succeeded', 'failed',
		'timed_out', 'oom_killed', 'killed', 'denied', 'approval_expired', 'launch_failed')),
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
CREATE INDEX executions_workspace ON executions (workspace_id, created_at, id);
CREATE INDEX executions_live ON executions (status) WHERE status IN ('queued', 'running');

CREATE TABLE reservations (
	id           TEXT PRIMARY KEY,
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	execution_id TEXT NOT NULL UNIQUE REFERENCES executions (id),
	amount       INTEGER NOT NULL CHECK (amount > 0),
	status       TEXT NOT NULL CHECK (status IN ('open', 'committed', 'released')),
	created_at   INTEGER NOT NULL,
	settled_at   INTEGER
) STRICT;

CREATE TABLE tool_calls (
	id               TEXT PRIMARY KEY,
	execution_id     TEXT NOT NULL UNIQUE REFERENCES executions (id),
	workspace_id     TEXT NOT NULL REFERENCES workspaces (id),
	tool             TEXT NOT NULL,
	runtime          TEXT NOT NULL,
	input_sha256     TEXT NOT NULL,
	status           TEXT NOT NULL,
	exit_code        INTEGER,
	stdout_preview   BLOB NOT NULL,
	stderr_preview   BLOB NOT NULL,
	stdout_truncated INTEGER NOT NULL CHECK (stdout_truncated IN (0, 1)),
	stderr_truncated INTEGER NOT NULL CHECK (stderr_truncated IN (0, 1)),
	driver           TEXT NOT NULL DEFAULT '',
	credits_charged  INTEGER NOT NULL CHECK (credits_charged >= 0),
	created_at       INTEGER NOT NULL,
	started_at       INTEGER,
	finished_at      INTEGER
) STRICT;
CREATE INDEX tool_calls_workspace ON tool_calls (workspace_id, created_at, id);

CREATE TABLE tool_invocations (
	id           TEXT PRIMARY KEY,
	execution_id TEXT NOT NULL UNIQUE REFERENCES executions (id),
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	tool         TEXT NOT NULL,
	runtime      TEXT NOT NULL,
	status       TEXT NOT NULL,
	driver       TEXT NOT NULL,
	queued_us    INTEGER NOT NULL,
	ran_us       INTEGER NOT NULL,
	credits      INTEGER NOT NULL,
	created_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX tool_invocations_workspace ON tool_invocations (workspace_id, created_at, id);

CREATE TABLE approval_requests (
	id           TEXT PRIMARY KEY,
	execution_id TEXT NOT NULL UNIQUE REFERENCES executions (id),
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	status       TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
	card         TEXT NOT NULL,
	requested_at INTEGER NOT NULL,
	expires_at   INTEGER NOT NULL,
	decided_by   TEXT REFERENCES api_keys (id),
	decided_at   INTEGER,
	reason       TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX approval_requests_workspace ON approval_requests (workspace_id, requested_at, id);
CREATE INDEX approval_requests_pending ON approval_requests (expires_at) WHERE status = 'pending';

-- audit_events has no foreign key to workspaces: the empty workspace id is
-- the chain of events no workspace can be attributed to.
CREATE TABLE audit_events (
	id           TEXT PRIMARY KEY,
	workspace_id TEXT NOT NULL,
	seq          INTEGER NOT NULL,
	type         TEXT NOT NULL,
	code         TEXT NOT NULL,
	actor        TEXT NOT NULL,
	reason       TEXT NOT NULL,
	execution_id TEXT NOT NULL,
	data         TEXT,
	occurred_at  INTEGER NOT NULL,
	prev_hash    TEXT NOT NULL,
	hash         TEXT NOT NULL,
	UNIQUE (workspace_id, seq)
) STRICT;
CREATE INDEX audit_events_execution ON audit_events (workspace_id, execution_id);
CREATE INDEX audit_events_time ON audit_events (workspace_id, occurred_at);

CREATE TABLE audit_chain_heads (
	workspace_id TEXT PRIMARY KEY,
	seq          INTEGER NOT NULL,
	hash         TEXT NOT NULL
) STRICT;
