-- The recovery sweep: what an operation was asked (to resume it without its client),
-- how often the sweep took it over, and when it gave up on it.
ALTER TABLE idempotency_keys ADD COLUMN request TEXT;  -- the validated request, as JSON
ALTER TABLE idempotency_keys ADD COLUMN recoveries BIGINT NOT NULL DEFAULT 0;
ALTER TABLE idempotency_keys ADD COLUMN attention_at BIGINT;  -- set when the sweep gave up
CREATE INDEX idempotency_keys_unfinished ON idempotency_keys (lease_until) WHERE status IS NULL;
