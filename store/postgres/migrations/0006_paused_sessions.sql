-- Sessions can be paused (store.Sessions.PauseSession): their sandbox is
-- saved to a checkpoint on disk, whose size is recorded, and gone until a
-- resume starts it again.

ALTER TABLE sessions DROP CONSTRAINT sessions_state_check;
ALTER TABLE sessions ADD CONSTRAINT sessions_state_check CHECK (state IN ('active', 'paused', 'ended'));
ALTER TABLE sessions ADD COLUMN paused_at TIMESTAMPTZ;
ALTER TABLE sessions ADD COLUMN checkpoint_bytes BIGINT NOT NULL DEFAULT 0 CHECK (checkpoint_bytes >= 0);
ALTER TABLE sessions ADD CONSTRAINT sessions_paused_check CHECK ((state = 'paused') = (paused_at IS NOT NULL));
DROP INDEX sessions_active;
CREATE INDEX sessions_live ON sessions (workspace_id) WHERE state <> 'ended';
