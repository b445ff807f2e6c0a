-- The workspace policy's fork_approval (docs/design.md §10): whether a
-- session started from a snapshot under approval per_session inherits the
-- approval that covered its source ('inherit') or has its first cell
-- approved anew ('anew', the default and the meaning of every policy
-- written before).

ALTER TABLE workspace_policies ADD COLUMN fork_approval TEXT NOT NULL DEFAULT 'anew'
	CHECK (fork_approval IN ('anew', 'inherit'));
