-- Money back (docs/refunds.md). One row per refund, made by one operation: the unique
-- (operation_key, caller) is the refund key (an Idempotency-Key names an operation only
-- together with its caller, as for receipts), so a repeat finds its refund. Part of the
-- operator contract, as receipts is. id and receipt_id are hyphenated UUIDs, created_at
-- RFC 3339 UTC text, as Postgres would print them.
--
-- The sum of an order's refunds never passes its charge: `receipts.refunded_minor` moves
-- in the transaction that inserts the refund, by a conditional update (SQLite has one
-- writer), and a CHECK keeps it within the receipt's amount.
ALTER TABLE receipts ADD COLUMN refunded_minor INTEGER NOT NULL DEFAULT 0
    CHECK (refunded_minor >= 0 AND refunded_minor <= amount_minor);

CREATE TABLE refunds (
    id                 TEXT    PRIMARY KEY NOT NULL,
    order_id           TEXT    NOT NULL REFERENCES receipts (order_id),
    receipt_id         TEXT    NOT NULL REFERENCES receipts (id),
    amount_minor       INTEGER NOT NULL CHECK (amount_minor > 0),
    currency           TEXT    NOT NULL CHECK (length(currency) = 3),
    operation_key      TEXT    NOT NULL,
    caller             TEXT    NOT NULL,
    reason             TEXT,
    status             TEXT    NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    provider_refund_id TEXT,
    created_at         TEXT    NOT NULL,
    UNIQUE (operation_key, caller)
) STRICT;
CREATE INDEX refunds_order ON refunds (order_id);
