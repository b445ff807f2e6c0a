-- Snapshots of live sessions (store.Snapshots): a session's saved state,
-- from which new sessions of its workspace start. A snapshot outlives its
-- source session (no foreign key to it is enforced on delete: sessions
-- are never deleted), and is deleted by its owner or at expires_at.

CREATE TABLE snapshots (
	id           TEXT PRIMARY KEY,
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	session_id   TEXT NOT NULL REFERENCES sessions (id),
	key_id       TEXT NOT NULL REFERENCES api_keys (id),
	name         TEXT NOT NULL DEFAULT '',
	tool         TEXT NOT NULL,
	runtime      TEXT NOT NULL,
	driver       TEXT NOT NULL,
	dir          TEXT NOT NULL,
	bytes        BIGINT NOT NULL CHECK (bytes >= 0),
	created_at   TIMESTAMPTZ NOT NULL,
	expires_at   TIMESTAMPTZ NOT NULL
);

CREATE INDEX snapshots_session ON snapshots (workspace_id, session_id, created_at);
CREATE INDEX snapshots_expiry ON snapshots (expires_at);
