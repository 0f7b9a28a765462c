-- The thresholds of a budget a caller's day has crossed (80 and 100 per cent), each with
-- the `budget.threshold` event that announced it (docs/webhooks.md). Written in the
-- transaction that reserved the crossing charge, by `INSERT … ON CONFLICT DO NOTHING`: the
-- primary key, not a read before the write, makes one event per caller, currency, day and
-- threshold, whatever is given back and spent again.
CREATE TABLE budget_thresholds (
    caller     TEXT    NOT NULL,
    currency   TEXT    NOT NULL,
    day        INTEGER NOT NULL,  -- days since 1970-01-01, UTC, as in `budgets`
    threshold  INTEGER NOT NULL CHECK (threshold IN (80, 100)),  -- per cent of the budget
    event_id   TEXT    NOT NULL,  -- its row of webhook_events
    PRIMARY KEY (caller, currency, day, threshold)
) STRICT;
