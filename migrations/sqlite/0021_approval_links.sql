-- An approval's links (docs/webhooks.md#approval-links): each a capability to make one
-- decision, sent in approval.requested. Only the SHA-256 of a link's token is kept: the
-- database alone cannot make a working link. A link decides through the same
-- one-transaction decision as POST /approvals/{id}/approve|deny, so the first decision
-- wins whatever channel made it; a link is usable while its approval is pending.
CREATE TABLE approval_links (
    token_hash   TEXT NOT NULL PRIMARY KEY,  -- hex SHA-256 of the token
    approval_id  TEXT NOT NULL,
    decision     TEXT NOT NULL  -- approve, deny
) STRICT;
