-- What each caller was charged per currency per UTC day, against its budget
-- (CHECKOUT_BUDGET_PER_DAY, or its API key's --budget-per-day): docs/budgets-and-scopes.md.
-- A charge reserves its amount here in the transaction that records it (the receipt, or
-- the provider's intent), by a conditional upsert; SQLite has one writer. Only callers
-- with a budget have rows. `day` is the UTC day of the database's clock, in days since
-- 1970-01-01. Refunds give nothing back.
CREATE TABLE budgets (
    caller      TEXT    NOT NULL,
    currency    TEXT    NOT NULL CHECK (length(currency) = 3),
    day         INTEGER NOT NULL,
    spent_minor INTEGER NOT NULL CHECK (spent_minor >= 0),
    PRIMARY KEY (caller, currency, day)
) STRICT;
-- The day an intent reserved its amount on (NULL: its caller had no budget), so that an
-- attempt that ended without charging (declined, absent) gives it back.
ALTER TABLE payment_intents ADD COLUMN budget_day INTEGER;
