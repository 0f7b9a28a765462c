-- Events for the operator's webhook endpoint (docs/webhooks.md): one row per fact
-- announced, written in the transaction of that fact (an approval asked for or decided,
-- a receipt, a refund), so that no fact commits without its event nor an event without
-- its fact. A deliverer claims due rows under a lease (`claimed_until`, fenced by
-- `claim`), so an instance that dies mid-delivery leaves its row to another once the
-- lease lapses. The body is rendered once, when the row is written, and sent byte for
-- byte (and signed) on every attempt. The service's own table; times are epoch
-- milliseconds from the `clock` view.
CREATE TABLE webhook_events (
    id              TEXT COLLATE "C" NOT NULL PRIMARY KEY,  -- webhook-id: the same on every attempt
    type            TEXT    NOT NULL,  -- approval.requested, charge.succeeded, …
    body            TEXT    NOT NULL,  -- {"type","timestamp","data"}, as sent
    status          TEXT    NOT NULL DEFAULT 'pending',  -- pending, delivered, failed
    attempts        BIGINT NOT NULL DEFAULT 0,  -- delivery attempts begun
    claim           BIGINT NOT NULL DEFAULT 0,  -- +1 on every claim: a fence
    claimed_until   BIGINT,           -- a deliverer's lease on the row
    next_attempt_at BIGINT NOT NULL,  -- not claimed before this (the retry schedule)
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    delivered_at    BIGINT
);
CREATE INDEX webhook_events_due ON webhook_events (next_attempt_at) WHERE status = 'pending';

-- An endpoint that answered 410 Gone: no event is sent to it again (on any instance)
-- until an operator deletes its row or configures another URL.
CREATE TABLE webhook_endpoints (
    url          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    disabled_at  BIGINT NOT NULL,
    reason       TEXT    NOT NULL
);
