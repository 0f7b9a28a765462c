-- One delivery path for every webhook endpoint (docs/webhooks.md). CHECKOUT_WEBHOOK_URL
-- becomes one more row of webhook_subscriptions (id 'env', written from the settings at
-- start-up), and every delivery, to it as to the endpoints of `checkout webhooks add`, is
-- a row of webhook_deliveries, written in the transaction of the fact with the event
-- itself: one claim, one send and one record for all of them.
--
-- An event keeps only what is sent (webhook_messages). Its status is its deliveries':
-- the view webhook_events reads it from them, so that it cannot disagree with them (an
-- event sent to every endpoint that takes it stayed `pending` in webhook_events forever
-- when CHECKOUT_WEBHOOK_URL did not take it).
CREATE TABLE webhook_messages (
    id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,  -- webhook-id: the same on every attempt
    type        TEXT   NOT NULL,  -- approval.requested, charge.succeeded, …
    body        TEXT   NOT NULL,  -- {"type","timestamp","data"}, as sent and signed
    created_at  BIGINT NOT NULL
);
INSERT INTO webhook_messages (id, type, body, created_at)
    SELECT id, type, body, created_at FROM webhook_events;

-- CHECKOUT_WEBHOOK_URL's deliveries so far, as deliveries to 'env': its history, and what
-- it has still to send. At start-up an instance with CHECKOUT_WEBHOOK_URL drops those of
-- the pending ones whose type it does not take, one without it drops them all; a URL that
-- answered 410 before is tried once more (and disabled again if it answers 410 again).
INSERT INTO webhook_deliveries (event_id, subscription, status, attempts, claim,
        next_attempt_at, last_error, created_at, delivered_at)
    SELECT id, 'env', status, attempts, claim, next_attempt_at, last_error, created_at,
        delivered_at
    FROM webhook_events;
DROP TABLE webhook_events;
DROP TABLE webhook_endpoints;

-- An event with its status across its deliveries: pending while one is, failed when one
-- was given up, unsent when no endpoint took it (none did when it was written, or the
-- only ones that did were removed before sending it), else delivered.
CREATE VIEW webhook_events AS
SELECT m.id, m.type, m.body, m.created_at,
    CASE
        WHEN EXISTS (SELECT 1 FROM webhook_deliveries d
                     WHERE d.event_id = m.id AND d.status = 'pending') THEN 'pending'
        WHEN EXISTS (SELECT 1 FROM webhook_deliveries d
                     WHERE d.event_id = m.id AND d.status = 'failed') THEN 'failed'
        WHEN NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                         WHERE d.event_id = m.id) THEN 'unsent'
        ELSE 'delivered'
    END AS status
FROM webhook_messages m;
