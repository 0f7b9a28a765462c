-- What an approval lets go through: a charge (POST /checkout) or a refund (POST /refunds,
-- docs/refunds.md). Approvals made before refunds were charges.
ALTER TABLE approvals ADD COLUMN kind TEXT NOT NULL DEFAULT 'charge' CHECK (kind IN ('charge', 'refund'));
