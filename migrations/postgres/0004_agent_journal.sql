-- The assistant's journal: every model answer and every tool result of an operation, in
-- order, so that a retry of any unit resumes the loop instead of restarting it.
-- The service's own table. Times are epoch milliseconds, read from the `clock` view.
CREATE TABLE agent_journal (
    scope         TEXT   NOT NULL,  -- the caller; '' for an anonymous one
    operation_key TEXT   NOT NULL,  -- the Idempotency-Key, or the minted UUIDv7
    step          BIGINT NOT NULL,  -- 1, 2, … after the opening prompt
    kind          TEXT   NOT NULL,  -- 'answer' (a model answer) or 'tool' (a tool result)
    name          TEXT   NOT NULL,  -- the tool's name; '' for an answer
    call_id       TEXT,             -- the tool call id, as the provider sent it
    body          TEXT   NOT NULL,  -- the assistant message verbatim, or the tool result
    pins          TEXT,             -- step 1: what the journal is valid for
    input_tokens  BIGINT,           -- an answer's usage, as the provider reported it
    output_tokens BIGINT,
    expires_at    BIGINT NOT NULL,
    PRIMARY KEY (scope, operation_key, step)
);
CREATE INDEX agent_journal_expires_at ON agent_journal (expires_at);
