-- One clock for every statement that needs the time, read the same way on both databases:
-- `SELECT now_ms FROM clock`. On Postgres it is the database's clock, so instances whose
-- own clocks disagree still agree on when a lease lapses.
CREATE VIEW clock AS SELECT (extract(epoch FROM now()) * 1000)::bigint AS now_ms;

-- The service's own times become epoch milliseconds, as on SQLite, so that one SQL text
-- serves both; status becomes BIGINT so that one Rust type decodes it on both.
ALTER TABLE idempotency_keys
    ALTER COLUMN lease_until TYPE BIGINT USING (extract(epoch FROM lease_until) * 1000)::bigint,
    ALTER COLUMN created_at  TYPE BIGINT USING (extract(epoch FROM created_at) * 1000)::bigint,
    ALTER COLUMN expires_at  TYPE BIGINT USING (extract(epoch FROM expires_at) * 1000)::bigint,
    ALTER COLUMN status      TYPE BIGINT;
