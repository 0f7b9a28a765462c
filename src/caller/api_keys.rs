//! The `api_keys` table: one row per key, by name, with the SHA-256 of the key (never the
//! key). Every statement is one text for both databases, timed by their `clock` view.

use super::{Caller, KeySpec, Scopes};
use crate::db::{Conn, StoreError, on_conn};
use crate::payments::PerCurrency;

/// A key as listed: never the key, nor its hash.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Listed {
    pub name: String,
    /// Epoch milliseconds.
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// As stored: a comma list.
    pub scopes: String,
    pub approval_above: Option<String>,
    pub budget_per_day: Option<String>,
}

/// A key found by its hash.
#[derive(Debug, sqlx::FromRow)]
pub struct Found {
    pub name: String,
    pub key_hash: String,
    pub revoked_at: Option<i64>,
    pub scopes: String,
    pub approval_above: Option<String>,
    pub budget_per_day: Option<String>,
}

impl Found {
    /// The caller this key names, with what it may do; a value no `api-keys create` wrote
    /// is refused.
    pub fn into_caller(self) -> Result<Caller, StoreError> {
        let corrupt = |what: &str, err: String| {
            StoreError::Corrupt(format!("API key {:?}: {what}: {err}", self.name))
        };
        let limit = |what: &str, text: &Option<String>| {
            text.as_deref()
                .map(PerCurrency::parse)
                .transpose()
                .map_err(|err| corrupt(what, err))
        };
        Ok(Caller {
            scopes: Scopes::parse(&self.scopes).map_err(|err| corrupt("scopes", err))?,
            approval_above: limit("approval_above", &self.approval_above)?,
            budget_per_day: limit("budget_per_day", &self.budget_per_day)?,
            name: self.name,
        })
    }
}

const INSERT: &str = "\
    INSERT INTO api_keys (name, key_hash, created_at, scopes, approval_above, budget_per_day) \
    SELECT $1, $2, now_ms, $3, $4, $5 FROM clock WHERE true \
    ON CONFLICT (name) DO NOTHING";

const REVOKE: &str = "\
    UPDATE api_keys SET revoked_at = (SELECT now_ms FROM clock) \
    WHERE name = $1 AND revoked_at IS NULL";

const FIND: &str = "SELECT name, key_hash, revoked_at, scopes, approval_above, budget_per_day \
    FROM api_keys WHERE key_hash = $1";

const BY_NAME: &str = "SELECT name, key_hash, revoked_at, scopes, approval_above, budget_per_day \
    FROM api_keys WHERE name = $1";

const ANY: &str = "SELECT count(*) FROM (SELECT 1 FROM api_keys LIMIT 1) AS one";

const LIST: &str = "SELECT name, created_at, revoked_at, scopes, approval_above, budget_per_day \
    FROM api_keys ORDER BY created_at, name";

/// Adds a key by the hex SHA-256 of it; false when the name is taken (nothing is written).
pub async fn insert(
    conn: Conn<'_>,
    name: &str,
    key_hash: &str,
    spec: &KeySpec,
) -> Result<bool, StoreError> {
    let limit = |l: &Option<PerCurrency>| l.as_ref().map(PerCurrency::to_string);
    let done = on_conn!(conn, c => sqlx::query(INSERT)
        .bind(name)
        .bind(key_hash)
        .bind(spec.scopes.to_string())
        .bind(limit(&spec.approval_above))
        .bind(limit(&spec.budget_per_day))
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// Revokes the key; false when no unrevoked key has this name.
pub async fn revoke(conn: Conn<'_>, name: &str) -> Result<bool, StoreError> {
    let done = on_conn!(conn, c => sqlx::query(REVOKE)
        .bind(name)
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// The key whose hex SHA-256 this is, revoked or not.
pub async fn find(conn: Conn<'_>, key_hash: &str) -> Result<Option<Found>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_as(FIND)
        .bind(key_hash)
        .fetch_optional(c)
        .await?))
}

/// The key named `name`, revoked or not.
pub async fn by_name(conn: Conn<'_>, name: &str) -> Result<Option<Found>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_as(BY_NAME)
        .bind(name)
        .fetch_optional(c)
        .await?))
}

/// Whether any key was ever made (a revoked one counts).
pub async fn any(conn: Conn<'_>) -> Result<bool, StoreError> {
    let n: i64 = on_conn!(conn, c => sqlx::query_scalar(ANY).fetch_one(c).await?);
    Ok(n > 0)
}

/// Every key, oldest first.
pub async fn list(conn: Conn<'_>) -> Result<Vec<Listed>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_as(LIST).fetch_all(c).await?))
}
