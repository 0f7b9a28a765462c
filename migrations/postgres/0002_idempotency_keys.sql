-- One row per Idempotency-Key: the request it was first used for, who is working on it
-- (a lease with a fencing token), and once finished, the answer to replay.
-- The service's own table; races on it are settled by the primary key and by updates
-- that name the fence they expect.
CREATE TABLE idempotency_keys (
    scope        TEXT        NOT NULL,  -- the caller; '' for an anonymous one
    key          TEXT        NOT NULL,
    fingerprint  TEXT        NOT NULL,  -- method, path, order id, amount, currency
    fence        BIGINT      NOT NULL,  -- +1 on every takeover of the lease
    lease_until  TIMESTAMPTZ,           -- NULL once the answer is saved
    status       INTEGER,               -- the saved answer, once finished
    content_type TEXT,
    body         BYTEA,
    created_at   TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
