-- Idempotency keys are scoped to the API key that sent them, not to its
-- workspace: another key of the workspace that reuses one starts its own
-- request instead of being answered with the first key's. Rows that
-- exist keep their keys: two keys of one workspace never shared one.

ALTER TABLE executions DROP CONSTRAINT executions_workspace_id_idempotency_key_key;
ALTER TABLE executions ADD CONSTRAINT executions_key_id_idempotency_key_key UNIQUE (key_id, idempotency_key);
ALTER TABLE sessions DROP CONSTRAINT sessions_workspace_id_idempotency_key_key;
ALTER TABLE sessions ADD CONSTRAINT sessions_key_id_idempotency_key_key UNIQUE (key_id, idempotency_key);
