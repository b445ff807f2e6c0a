-- The last use of an API key, recorded in batches after the fact
-- (store.Keys.RecordKeyUses); NULL until its first recorded use.
ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER;
