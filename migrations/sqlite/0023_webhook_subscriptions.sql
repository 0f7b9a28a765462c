-- More webhook endpoints, each with its URL, its events and its secret, kept by
-- `checkout webhooks add|list|remove` (docs/webhooks.md). The secret is stored as given:
-- it signs every request, so it cannot be hashed. CHECKOUT_WEBHOOK_URL is not among them:
-- its events keep their delivery state in webhook_events, as before.
CREATE TABLE webhook_subscriptions (
    id          TEXT NOT NULL PRIMARY KEY,  -- ep_…, printed by add, taken by remove
    url         TEXT    NOT NULL,
    events      TEXT    NOT NULL,  -- all, or event types separated by commas
    secret      TEXT    NOT NULL,  -- whsec_… (several during a rotation)
    created_at  INTEGER  NOT NULL,  -- it receives the events written from then on
    disabled_at INTEGER,            -- it answered 410 Gone: nothing more is sent to it
    reason      TEXT
) STRICT;

-- One delivery per event and endpoint of webhook_subscriptions that takes its type, each
-- with its own attempts, lease and retries, as webhook_events has for CHECKOUT_WEBHOOK_URL.
-- A deliverer makes them from the events not yet fanned out (webhook_events.fanned_at),
-- `ON CONFLICT DO NOTHING`: two instances doing it at once make one row per pair.
CREATE TABLE webhook_deliveries (
    event_id        TEXT NOT NULL,
    subscription    TEXT NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending',  -- pending, delivered, failed
    attempts        INTEGER  NOT NULL DEFAULT 0,
    claim           INTEGER  NOT NULL DEFAULT 0,  -- +1 on every claim: a fence
    claimed_until   INTEGER,
    next_attempt_at INTEGER  NOT NULL,
    last_error      TEXT,
    created_at      INTEGER  NOT NULL,
    delivered_at    INTEGER,
    PRIMARY KEY (event_id, subscription)
) STRICT;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';

-- When a deliverer made the event's rows of webhook_deliveries (NULL: not yet).
ALTER TABLE webhook_events ADD COLUMN fanned_at INTEGER;
CREATE INDEX webhook_events_unfanned ON webhook_events (created_at) WHERE fanned_at IS NULL;
