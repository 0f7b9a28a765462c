-- The caller whose operation made the charge ('' for an anonymous one): with API keys,
-- an Idempotency-Key names an operation only together with its caller, so "this
-- operation made the charge" compares both.
ALTER TABLE receipts ADD COLUMN caller TEXT NOT NULL DEFAULT '';
