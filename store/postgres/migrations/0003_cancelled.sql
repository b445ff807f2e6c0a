-- Executions and approval requests can end cancelled (CancelExecution).

ALTER TABLE executions DROP CONSTRAINT executions_status_check;
ALTER TABLE executions ADD CONSTRAINT executions_status_check CHECK (status IN ('queued', 'awaiting_approval', 'running',
	'succeeded', 'failed', 'timed_out', 'oom_killed', 'killed', 'denied', 'approval_expired', 'launch_failed', 'cancelled'));

ALTER TABLE approval_requests DROP CONSTRAINT approval_requests_status_check;
ALTER TABLE approval_requests ADD CONSTRAINT approval_requests_status_check
	CHECK (status IN ('pending', 'approved', 'denied', 'expired', 'cancelled'));
