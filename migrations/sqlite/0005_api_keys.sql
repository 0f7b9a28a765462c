-- One row per API key a caller sends as `Authorization: Bearer …`. The key itself is never
-- stored: only its SHA-256, which a request's key is looked up by. A revoked key keeps its
-- row (and its name: a name is never reused, so a new caller never inherits the
-- Idempotency-Keys and saved answers an old one scoped under it). Times are epoch ms.
CREATE TABLE api_keys (
    name       TEXT    PRIMARY KEY,
    key_hash   TEXT    NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
) STRICT;
