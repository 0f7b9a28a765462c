-- Identifiers compare byte by byte (issue 34).
--
-- Keys, order ids, callers and the like are opaque identifiers: they are only ever
-- looked up by equality and ordered in their indexes. Every column that holds one, in
-- every table, changes together, so that two of them compared in a join have one
-- collation (mixed, Postgres could not tell which to compare with). Under the database's default
-- collation every comparison in those indexes went through the locale's `strcoll`
-- (Postgres 15 takes the `C` shortcut only for the `C` and `POSIX` collations, not for
-- `C.UTF-8`, and less still for `en_US.UTF-8`): some 10 % of Postgres's CPU in a keyed
-- checkout, whose claim, journal steps and saved answer each probe these indexes.
-- `COLLATE "C"` compares with `memcmp`. Equality is unchanged (byte equality under any
-- deterministic collation), so no key that was equal becomes different or the reverse.
--
-- Each table and its indexes are rewritten, under an exclusive lock, once: on a large
-- deployment, apply it in a quiet hour.
ALTER TABLE idempotency_keys
    ALTER COLUMN scope TYPE text COLLATE "C",
    ALTER COLUMN key TYPE text COLLATE "C";
ALTER TABLE agent_journal
    ALTER COLUMN scope TYPE text COLLATE "C",
    ALTER COLUMN operation_key TYPE text COLLATE "C";
ALTER TABLE receipts
    ALTER COLUMN order_id TYPE text COLLATE "C",
    ALTER COLUMN operation_key TYPE text COLLATE "C",
    ALTER COLUMN caller TYPE text COLLATE "C";
ALTER TABLE refunds
    ALTER COLUMN order_id TYPE text COLLATE "C",
    ALTER COLUMN operation_key TYPE text COLLATE "C",
    ALTER COLUMN caller TYPE text COLLATE "C";
ALTER TABLE outbox
    ALTER COLUMN scope TYPE text COLLATE "C",
    ALTER COLUMN operation_key TYPE text COLLATE "C",
    ALTER COLUMN kind TYPE text COLLATE "C";
ALTER TABLE payment_intents
    ALTER COLUMN order_id TYPE text COLLATE "C",
    ALTER COLUMN operation_key TYPE text COLLATE "C",
    ALTER COLUMN caller TYPE text COLLATE "C",
    ALTER COLUMN provider_key TYPE text COLLATE "C";
ALTER TABLE approvals
    ALTER COLUMN id TYPE text COLLATE "C",
    ALTER COLUMN order_id TYPE text COLLATE "C",
    ALTER COLUMN caller TYPE text COLLATE "C",
    ALTER COLUMN operation_key TYPE text COLLATE "C";
ALTER TABLE budgets
    ALTER COLUMN caller TYPE text COLLATE "C";
ALTER TABLE api_keys
    ALTER COLUMN name TYPE text COLLATE "C",
    ALTER COLUMN key_hash TYPE text COLLATE "C";
