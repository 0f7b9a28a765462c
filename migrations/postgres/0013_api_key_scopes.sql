-- What an API key may do, and its own limits (docs/budgets-and-scopes.md).
--   scopes:          a comma list of checkout, refund, approve, read.
--   approval_above:  `USD:50.00,EUR:40.00`: charges above it wait for a person; NULL:
--                    CHECKOUT_APPROVAL_ABOVE decides.
--   budget_per_day:  the same form: what the key's caller may be charged per UTC day;
--                    NULL: CHECKOUT_BUDGET_PER_DAY decides.
-- Keys that exist keep what they could do: until now every key could check out and read
-- every receipt, so they get `checkout,read` (the default below). `checkout api-keys
-- create` always names the scopes it gives (`checkout` unless told).
ALTER TABLE api_keys ADD COLUMN scopes TEXT NOT NULL DEFAULT 'checkout,read';
ALTER TABLE api_keys ADD COLUMN approval_above TEXT;
ALTER TABLE api_keys ADD COLUMN budget_per_day TEXT;
