-- A charge above an amount that waits for a person's decision (docs/approvals.md). One row
-- per operation: the operation's loop stopped at its charge call, its journal kept, and
-- its Idempotency-Key record holds the 202 answer until the decision. The first decision
-- wins: every change of `status` is a conditional update from 'pending'. Times are epoch
-- milliseconds, read from the `clock` view.
CREATE TABLE approvals (
    id            TEXT   PRIMARY KEY,  -- UUIDv7, as the API shows it
    caller        TEXT   NOT NULL,     -- who asked for the checkout
    operation_key TEXT   NOT NULL,     -- its operation (Idempotency-Key, or the minted key)
    order_id      TEXT   NOT NULL,
    amount_minor  INTEGER NOT NULL CHECK (amount_minor > 0),
    currency      TEXT   NOT NULL CHECK (length(currency) = 3),
    status        TEXT   NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
    reason        TEXT,                -- a denial's reason, as its decider gave it
    decided_by    TEXT,                -- the caller that decided ('' in open mode)
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    decided_at    INTEGER,
    UNIQUE (caller, operation_key)
) STRICT;
-- The expiry sweep's and the pending gauge's reads.
CREATE INDEX approvals_pending ON approvals (expires_at) WHERE status = 'pending';
