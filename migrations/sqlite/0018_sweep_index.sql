-- The recovery sweep's index, narrowed so that only the sweep can use it (issue 34).
--
-- Every keyed checkout's record enters `idempotency_keys_unfinished` at its claim and
-- leaves it only when vacuum removes the old row version, so under load the index holds
-- tens of thousands of entries for a few hundred live unfinished records. Postgres's
-- planner, which counts only the live ones, chose it for the lookups by key that also ask
-- for `status IS NULL` (the saved answer, a journal step's fence check): each such lookup
-- read every entry instead of one primary-key probe. A saved answer's group took 30-95 ms,
-- and keyed checkouts fell to a third of their throughput until autovacuum came by.
-- The new predicate holds only what the sweep asks for (`request IS NOT NULL`, no
-- attention), which no lookup by key asks, so those go by the primary key.
DROP INDEX idempotency_keys_unfinished;
CREATE INDEX idempotency_keys_sweep ON idempotency_keys (lease_until)
    WHERE status IS NULL AND attention_at IS NULL AND request IS NOT NULL;
