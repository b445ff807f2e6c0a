-- The E2B facts of a session opened through the E2B wire (package e2b):
-- the template it was asked for, its metadata and environment, the end
-- E2B's timeout sets (setTimeout moves it) and what it does then (kill,
-- or pause: autoPause), with the key that created it, which the data
-- plane acts as. A row lives as long as its session's.

CREATE TABLE e2b_sandboxes (
	session_id   TEXT PRIMARY KEY REFERENCES sessions (id),
	workspace_id TEXT NOT NULL REFERENCES workspaces (id),
	key_id       TEXT NOT NULL REFERENCES api_keys (id),
	role         TEXT NOT NULL,
	template     TEXT NOT NULL,
	metadata     TEXT NOT NULL,
	envs         TEXT NOT NULL,
	on_timeout   TEXT NOT NULL CHECK (on_timeout IN ('kill', 'pause')),
	end_at       INTEGER NOT NULL,
	created_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX e2b_sandboxes_workspace ON e2b_sandboxes (workspace_id, created_at);
CREATE INDEX e2b_sandboxes_end ON e2b_sandboxes (end_at);
