-- A session's end_detail says, in words a user reads, why it ended where
-- its end_reason alone does not: a session interrupted because the
-- daemon restarted and its driver cannot re-attach a sandbox
-- (docs/design.md, sessions). Empty for every session ended before.

ALTER TABLE sessions ADD COLUMN end_detail TEXT NOT NULL DEFAULT '';
