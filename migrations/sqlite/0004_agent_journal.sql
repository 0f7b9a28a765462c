-- The assistant's journal: every model answer and every tool result of an operation, in
-- order, so that a retry of any unit resumes the loop instead of restarting it.
-- Times are milliseconds since the Unix epoch.
CREATE TABLE agent_journal (
    scope         TEXT    NOT NULL,
    operation_key TEXT    NOT NULL,
    step          INTEGER NOT NULL,
    kind          TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    call_id       TEXT,
    body          TEXT    NOT NULL,
    pins          TEXT,
    input_tokens  INTEGER,
    output_tokens INTEGER,
    expires_at    INTEGER NOT NULL,
    PRIMARY KEY (scope, operation_key, step)
) STRICT;
CREATE INDEX agent_journal_expires_at ON agent_journal (expires_at);
