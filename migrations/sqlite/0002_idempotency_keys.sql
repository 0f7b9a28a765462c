-- One row per Idempotency-Key: the request it was first used for, who is working on it
-- (a lease with a fencing token), and once finished, the answer to replay.
-- Times are milliseconds since the Unix epoch.
CREATE TABLE idempotency_keys (
    scope        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    fingerprint  TEXT    NOT NULL,
    fence        INTEGER NOT NULL,
    lease_until  INTEGER,
    status       INTEGER,
    content_type TEXT,
    body         BLOB,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) STRICT;
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
