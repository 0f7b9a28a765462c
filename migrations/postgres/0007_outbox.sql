-- The outbox: effects that leave the service (the confirmation email), one row per
-- (caller scope, operation key, kind). The unique key is what makes a second call of
-- the tool, a loop retry, the client's retry or a resume write nothing new. The message
-- is rendered once, when the row is written, and sent byte for byte on every delivery
-- attempt. The service's own table; times are epoch milliseconds from the `clock` view.
CREATE TABLE outbox (
    scope           TEXT   NOT NULL,  -- the caller; '' for an anonymous one
    operation_key   TEXT   NOT NULL,  -- the Idempotency-Key, or the minted UUIDv7
    kind            TEXT   NOT NULL,  -- 'confirmation'
    message_id      TEXT   NOT NULL,  -- derived from (scope, operation key, kind)
    sender          TEXT   NOT NULL,  -- the envelope's MAIL FROM
    recipient       TEXT   NOT NULL,  -- the envelope's RCPT TO: the request's `email`
    message         BYTEA  NOT NULL,  -- the whole RFC 5322 message, headers included
    status          TEXT   NOT NULL DEFAULT 'queued',  -- queued, sent, failed
    attempts        BIGINT NOT NULL DEFAULT 0,         -- delivery attempts begun
    claim           BIGINT NOT NULL DEFAULT 0,         -- +1 on every claim: a fence
    claimed_until   BIGINT,           -- a dispatcher's lease on the row
    next_attempt_at BIGINT NOT NULL,  -- not claimed before this (backoff)
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    sent_at         BIGINT,
    PRIMARY KEY (scope, operation_key, kind)
);
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE status = 'queued';
