-- The analytics outbox (store.AnalyticsOutbox): the tool_invocations rows
-- not yet shipped to the analytics database. An entry is written in the
-- transaction that writes its tool_invocations row and deleted once shipped,
-- or dropped past the daemon's bounds; the row itself stays.
CREATE TABLE analytics_outbox (
	invocation_id TEXT PRIMARY KEY REFERENCES tool_invocations (id),
	enqueued_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX analytics_outbox_age ON analytics_outbox (enqueued_at, invocation_id);
