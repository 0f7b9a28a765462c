-- A charge through a payment provider, committed before the provider is called: what is
-- charged (order, amount, currency, payment method), under which provider idempotency key
-- (the charge key and the attempt), and what became of it. The service's own table.
-- (order_id, attempt) is unique: two instances racing to start an attempt make one row.
-- Times are epoch milliseconds, read from the `clock` view.
CREATE TABLE payment_intents (
    order_id            TEXT   NOT NULL,
    attempt             INTEGER NOT NULL CHECK (attempt > 0),
    amount_minor        INTEGER NOT NULL CHECK (amount_minor > 0),
    currency            TEXT   NOT NULL CHECK (length(currency) = 3),
    payment_method      TEXT   NOT NULL,
    provider_key        TEXT   NOT NULL UNIQUE,  -- the Idempotency-Key sent to the provider
    operation_key       TEXT   NOT NULL,         -- the operation that started the attempt
    caller              TEXT   NOT NULL,
    status              TEXT   NOT NULL,  -- pending, succeeded, declined, requires_action, absent
    provider_payment_id TEXT,             -- the provider's id (pi_…), once it answered
    decline_code        TEXT,
    created_ms          INTEGER NOT NULL,
    PRIMARY KEY (order_id, attempt)
) STRICT;
