-- The capability layer's schema, kept column for column identical to the
-- SQLite one (store/sqlite/migrations) so that one implementation serves
-- both. Times are TIMESTAMPTZ with PostgreSQL's microsecond precision.

CREATE TABLE workspaces (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL UNIQUE,
	created_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE api_keys (
	id           TEXT PRIMARY KEY,
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	role         TEXT NOT NULL CHECK (role IN ('agent', 'approver', 'admin')),
	name         TEXT NOT NULL DEFAULT '',
	hash         TEXT NOT NULL UNIQUE,
	created_at   TIMESTAMPTZ NOT NULL,
	revoked_at   TIMESTAMPTZ
);
CREATE INDEX api_keys_workspace ON api_keys (workspace_id, created_at);

CREATE TABLE workspace_policies (
	workspace_id    TEXT PRIMARY KEY REFERENCES workspaces (id),
	code_execution  BOOLEAN NOT NULL,
	approval        TEXT NOT NULL CHECK (approval IN ('required', 'none')),
	network_allowed BOOLEAN NOT NULL,
	max_timeout_ms  BIGINT NOT NULL CHECK (max_timeout_ms >= 0),
	runtimes        TEXT NOT NULL,
	tool_changes    TEXT NOT NULL CHECK (tool_changes IN ('flag', 'require_review')),
	updated_at      TIMESTAMPTZ NOT NULL
);

CREATE TABLE credit_accounts (
	workspace_id TEXT PRIMARY KEY REFERENCES workspaces (id),
	available    BIGINT NOT NULL CHECK (available >= 0),
	reserved     BIGINT NOT NULL CHECK (reserved >= 0)
);

CREATE TABLE credit_ledger (
	id             TEXT PRIMARY KEY,
	workspace_id   TEXT NOT NULL REFERENCES workspaces (id),
	kind           TEXT NOT NULL CHECK (kind IN ('grant', 'reserve', 'commit', 'release')),
	amount         BIGINT NOT NULL CHECK (amount > 0),
	reservation_id TEXT,
	execution_id   TEXT,
	note           TEXT NOT NULL DEFAULT '',
	created_at     TIMESTAMPTZ NOT NULL
);
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
	created_at      TIMESTAMPTZ NOT NULL,
	started_at      TIMESTAMPTZ,
	finished_at     TIMESTAMPTZ,
	UNIQUE (workspace_id, idempotency_key)
);
CREATE INDEX executions_workspace ON executions (workspace_id, created_at, id);
CREATE INDEX executions_live ON executions (status) WHERE status IN ('queued', 'running');

CREATE TABLE reservations (
	id           TEXT PRIMARY KEY,
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	execution_id TEXT NOT NULL UNIQUE REFERENCES executions (id),
	amount       BIGINT NOT NULL CHECK (amount > 0),
	status       TEXT NOT NULL CHECK (status IN ('open', 'committed', 'released')),
	created_at   TIMESTAMPTZ NOT NULL,
	settled_at   TIMESTAMPTZ
);

CREATE TABLE tool_calls (
	id               TEXT PRIMARY KEY,
	execution_id     TEXT NOT NULL UNIQUE REFERENCES executions (id),
	workspace_id     TEXT NOT NULL REFERENCES workspaces (id),
	tool             TEXT NOT NULL,
	runtime          TEXT NOT NULL,
	input_sha256     TEXT NOT NULL,
	status           TEXT NOT NULL,
	exit_code        BIGINT,
	stdout_preview   BYTEA NOT NULL,
	stderr_preview   BYTEA NOT NULL,
	stdout_truncated BOOLEAN NOT NULL,
	stderr_truncated BOOLEAN NOT NULL,
	driver           TEXT NOT NULL DEFAULT '',
	credits_charged  BIGINT NOT NULL CHECK (credits_charged >= 0),
	created_at       TIMESTAMPTZ NOT NULL,
	started_at       TIMESTAMPTZ,
	finished_at      TIMESTAMPTZ
);
CREATE INDEX tool_calls_workspace ON tool_calls (workspace_id, created_at, id);

CREATE TABLE tool_invocations (
	id           TEXT PRIMARY KEY,
	execution_id TEXT NOT NULL UNIQUE REFERENCES executions (id),
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	tool         TEXT NOT NULL,
	runtime      TEXT NOT NULL,
	status       TEXT NOT NULL,
	driver       TEXT NOT NULL,
	queued_us    BIGINT NOT NULL,
	ran_us       BIGINT NOT NULL,
	credits      BIGINT NOT NULL,
	created_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX tool_invocations_workspace ON tool_invocations (workspace_id, created_at, id);

CREATE TABLE approval_requests (
	id           TEXT PRIMARY KEY,
	execution_id TEXT NOT NULL UNIQUE REFERENCES executions (id),
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	status       TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
	card         TEXT NOT NULL,
	requested_at TIMESTAMPTZ NOT NULL,
	expires_at   TIMESTAMPTZ NOT NULL,
	decided_by   TEXT REFERENCES api_keys (id),
	decided_at   TIMESTAMPTZ,
	reason       TEXT NOT NULL DEFAULT ''
);
CREATE INDEX approval_requests_workspace ON approval_requests (workspace_id, requested_at, id);
CREATE INDEX approval_requests_pending ON approval_requests (expires_at) WHERE status = 'pending';

-- audit_events has no foreign key to workspaces: the empty workspace id is
-- the chain of events no workspace can be attributed to.
CREATE TABLE audit_events (
	id           TEXT PRIMARY KEY,
	workspace_id TEXT NOT NULL,
	seq          BIGINT NOT NULL,
	type         TEXT NOT NULL,
	code         TEXT NOT NULL,
	actor        TEXT NOT NULL,
	reason       TEXT NOT NULL,
	execution_id TEXT NOT NULL,
	data         TEXT,
	occurred_at  TIMESTAMPTZ NOT NULL,
	prev_hash    TEXT NOT NULL,
	hash         TEXT NOT NULL,
	UNIQUE (workspace_id, seq)
);
CREATE INDEX audit_events_execution ON audit_events (workspace_id, execution_id);
CREATE INDEX audit_events_time ON audit_events (workspace_id, occurred_at);

CREATE TABLE audit_chain_heads (
	workspace_id TEXT PRIMARY KEY,
	seq          BIGINT NOT NULL,
	hash         TEXT NOT NULL
);
