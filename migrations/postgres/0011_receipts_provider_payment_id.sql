-- The payment provider's id of the charge (Stripe's pi_…); NULL for the ledger's own.
ALTER TABLE receipts ADD COLUMN provider_payment_id TEXT;
