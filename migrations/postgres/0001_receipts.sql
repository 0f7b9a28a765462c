-- One row per charged order. The unique order_id is the charge key: a second charge of
-- the same order conflicts here and changes nothing. Part of the operator contract.
CREATE TABLE receipts (
    id            UUID        PRIMARY KEY,
    order_id      TEXT        NOT NULL UNIQUE,
    amount_minor  BIGINT      NOT NULL CHECK (amount_minor > 0),
    currency      TEXT        NOT NULL CHECK (length(currency) = 3),
    operation_key TEXT        NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
