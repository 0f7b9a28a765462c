//! An approval's links: two tokens a pause makes, each a capability for one decision.
//! Only their SHA-256 is stored; the links themselves travel in `approval.requested`.

use uuid::Uuid;

use super::Approvals;
use crate::db::{StoreError, on_conn};

/// The decision a link makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkDecision {
    Approve,
    Deny,
}

impl LinkDecision {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            LinkDecision::Approve => "approve",
            LinkDecision::Deny => "deny",
        }
    }
}

/// A pause's two links: their tokens (random, 256 bits; only their hashes are stored) and
/// what `approval.requested`'s `data` adds for them (their URLs, made by the caller).
#[derive(Clone, Debug)]
pub struct Links {
    pub approve: String,
    pub deny: String,
    pub announced: serde_json::Map<String, serde_json::Value>,
}

impl Links {
    /// Two fresh tokens, URL-safe.
    pub fn tokens() -> (String, String) {
        let token = || format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
        (token(), token())
    }
}

/// What is stored of a link's token.
pub(super) fn token_hash(token: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(super) const LINK: &str = "\
    INSERT INTO approval_links (token_hash, approval_id, decision) VALUES ($1, $2, $3) \
    ON CONFLICT (token_hash) DO NOTHING";
const BY_LINK: &str = "SELECT approval_id, decision FROM approval_links WHERE token_hash = $1";

impl Approvals {
    /// The approval a link's `token` decides, and how; `None` for a token no pause made.
    pub async fn by_link(&self, token: &str) -> Result<Option<(Uuid, LinkDecision)>, StoreError> {
        let mut conn = self.db.acquire().await?;
        let row: Option<(String, String)> = on_conn!(conn.conn(), c => sqlx::query_as(BY_LINK)
            .bind(token_hash(token))
            .fetch_optional(c)
            .await?);
        let Some((id, decision)) = row else {
            return Ok(None);
        };
        let id = Uuid::parse_str(&id)
            .map_err(|e| StoreError::Corrupt(format!("approval link's approval {id:?}: {e}")))?;
        let decision = match decision.as_str() {
            "approve" => LinkDecision::Approve,
            "deny" => LinkDecision::Deny,
            other => {
                return Err(StoreError::Corrupt(format!(
                    "approval link's decision {other:?}"
                )));
            }
        };
        Ok(Some((id, decision)))
    }
}
