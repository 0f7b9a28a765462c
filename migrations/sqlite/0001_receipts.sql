-- One row per charged order. The unique order_id is the charge key: a second charge of
-- the same order conflicts here and changes nothing. Part of the operator contract.
-- id is a hyphenated UUID and created_at RFC 3339 UTC text, as Postgres would print them.
CREATE TABLE receipts (
    id            TEXT    PRIMARY KEY NOT NULL,
    order_id      TEXT    NOT NULL UNIQUE,
    amount_minor  INTEGER NOT NULL CHECK (amount_minor > 0),
    currency      TEXT    NOT NULL CHECK (length(currency) = 3),
    operation_key TEXT    NOT NULL,
    created_at    TEXT    NOT NULL
) STRICT;
