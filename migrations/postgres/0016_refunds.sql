-- Money back (docs/refunds.md). One row per refund, made by one operation: the unique
-- (operation_key, caller) is the refund key (an Idempotency-Key names an operation only
-- together with its caller, as for receipts), so a repeat finds its refund. Part of the
-- operator contract, as receipts is.
--
-- The sum of an order's refunds never passes its charge: `receipts.refunded_minor` moves
-- in the transaction that inserts the refund, by a conditional update that re-reads the
-- row under its lock (two instances refunding at once are serialized by it), and a CHECK
-- keeps it within the receipt's amount whatever statement writes it.
ALTER TABLE receipts ADD COLUMN refunded_minor BIGINT NOT NULL DEFAULT 0;
ALTER TABLE receipts ADD CONSTRAINT receipts_refunded_within_amount
    CHECK (refunded_minor >= 0 AND refunded_minor <= amount_minor);

CREATE TABLE refunds (
    id                 UUID        PRIMARY KEY,
    order_id           TEXT        NOT NULL REFERENCES receipts (order_id),
    receipt_id         UUID        NOT NULL REFERENCES receipts (id),
    amount_minor       BIGINT      NOT NULL CHECK (amount_minor > 0),
    currency           TEXT        NOT NULL CHECK (length(currency) = 3),
    operation_key      TEXT        NOT NULL,
    caller             TEXT        NOT NULL,
    reason             TEXT,
    -- 'succeeded'; with a payment provider 'pending' from before it is asked until its
    -- answer is recorded, 'failed' when it refused (the amount is given back).
    status             TEXT        NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    provider_refund_id TEXT,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (operation_key, caller)
);
CREATE INDEX refunds_order ON refunds (order_id);
