-- The outbox's rows whose delivery ended are swept once they are older than the
-- idempotency records' retention (the sweeper of idempotency_keys does it); this index
-- finds them without reading the queued ones.
CREATE INDEX outbox_ended ON outbox (created_at) WHERE status <> 'queued';
