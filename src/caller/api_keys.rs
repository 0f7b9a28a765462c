//! Key administration (`checkout api-keys`): making, revoking and listing keys, and the
//! `api_keys` table: one row per key, by name, with the SHA-256 of the key (never the
//! key). Every statement is one text for both databases, timed by their `clock` view.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{Caller, Scopes};
use crate::db::{Conn, Database, StoreError, on_conn};
use crate::payments::PerCurrency;

/// What a new key may do: its scopes and its own limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySpec {
    pub scopes: Scopes,
    pub approval_above: Option<PerCurrency>,
    pub budget_per_day: Option<PerCurrency>,
}

impl KeySpec {
    /// The scope `checkout`, no limits of its own: `checkout api-keys create NAME`.
    pub fn checkout() -> KeySpec {
        KeySpec {
            scopes: Scopes::DEFAULT,
            ..KeySpec::default()
        }
    }
}

/// A new API key, as shown once to whoever made it.
pub struct NewKey {
    pub name: String,
    pub key: String,
}

/// The SHA-256 of a key, in lowercase hex: what the database keeps and looks keys up by.
///
/// A fast hash is enough here, unlike for passwords: a key carries 256 random bits, so
/// no one can guess one from its hash, however many hashes a second they try; a slow hash
/// (argon2, bcrypt) would only make every request slower.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyHash(String);

impl KeyHash {
    pub fn of(key: &str) -> KeyHash {
        let digest = Sha256::digest(key.as_bytes());
        KeyHash(hex::encode(digest))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Equal in time that does not depend on where the two differ.
    pub(super) fn matches(&self, stored: &str) -> bool {
        self.0.as_bytes().ct_eq(stored.as_bytes()).into()
    }
}

pub const KEY_PREFIX: &str = "ck_";

/// A fresh key: `ck_` and 32 random bytes in hex.
pub fn generate_key() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!("{KEY_PREFIX}{}", hex::encode(bytes)))
}

/// A key name: 1–64 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit.
pub fn valid_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a key name: 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
        ))
    }
}

/// Why `api-keys create` or `revoke` did nothing.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{0}")]
    InvalidName(String),
    /// Scopes or limits that do not parse, or no scope at all.
    #[error("{0}")]
    InvalidSpec(String),
    #[error(
        "an API key named {0:?} exists already (revoked or not; a name is never reused, so that no new caller inherits an old one's Idempotency-Keys)"
    )]
    NameTaken(String),
    #[error("no API key is named {0:?}")]
    NoSuchName(String),
    #[error("the API key {0:?} is revoked already")]
    AlreadyRevoked(String),
    #[error("no randomness from the operating system: {0}")]
    Random(getrandom::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Makes a key named `name` with the scope `checkout` and no limits of its own.
pub async fn create(db: &Database, name: &str) -> Result<NewKey, KeyError> {
    create_with(db, name, &KeySpec::checkout()).await
}

/// Makes a key named `name` that may do what `spec` says, keeps its hash, and returns the
/// key (shown only this once).
pub async fn create_with(db: &Database, name: &str, spec: &KeySpec) -> Result<NewKey, KeyError> {
    valid_name(name).map_err(KeyError::InvalidName)?;
    if spec.scopes == Scopes::default() {
        return Err(KeyError::InvalidSpec(
            "a key needs at least one scope: checkout, refund, approve, read".into(),
        ));
    }
    let key = generate_key().map_err(KeyError::Random)?;
    let mut conn = db.acquire().await?;
    if !insert(conn.conn(), name, KeyHash::of(&key).as_str(), spec).await? {
        return Err(KeyError::NameTaken(name.to_owned()));
    }
    Ok(NewKey {
        name: name.to_owned(),
        key,
    })
}

/// Revokes the key named `name`: from the next request on, on every instance, it is
/// refused.
pub async fn revoke(db: &Database, name: &str) -> Result<(), KeyError> {
    let mut conn = db.acquire().await?;
    if mark_revoked(conn.conn(), name).await? {
        return Ok(());
    }
    match all_keys(conn.conn())
        .await?
        .into_iter()
        .find(|k| k.name == name)
    {
        Some(_) => Err(KeyError::AlreadyRevoked(name.to_owned())),
        None => Err(KeyError::NoSuchName(name.to_owned())),
    }
}

/// The caller named `name` as its key says now, for work resumed without its request
/// (the recovery sweep): `""` is the anonymous caller of open mode; a name no key has
/// keeps no scopes and no limits of its own (the settings' still apply).
pub async fn named(db: &Database, name: &str) -> Result<Caller, StoreError> {
    if name.is_empty() {
        return Ok(Caller::open());
    }
    let mut conn = db.acquire().await?;
    match by_name(conn.conn(), name).await? {
        Some(found) => found.into_caller(),
        None => Ok(Caller {
            name: name.to_owned(),
            scopes: Scopes::default(),
            approval_above: None,
            budget_per_day: None,
        }),
    }
}

/// Whether any API key was ever made (a revoked one counts).
pub async fn keys_exist(db: &Database) -> Result<bool, StoreError> {
    let mut conn = db.acquire().await?;
    any(conn.conn()).await
}

/// Every key, oldest first: names and times, never a key.
pub async fn list(db: &Database) -> Result<Vec<Listed>, StoreError> {
    let mut conn = db.acquire().await?;
    all_keys(conn.conn()).await
}

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
async fn insert(
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
async fn mark_revoked(conn: Conn<'_>, name: &str) -> Result<bool, StoreError> {
    let done = on_conn!(conn, c => sqlx::query(REVOKE)
        .bind(name)
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// The key whose hex SHA-256 this is, revoked or not.
pub(super) async fn find(conn: Conn<'_>, key_hash: &str) -> Result<Option<Found>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_as(FIND)
        .bind(key_hash)
        .fetch_optional(c)
        .await?))
}

/// The key named `name`, revoked or not.
async fn by_name(conn: Conn<'_>, name: &str) -> Result<Option<Found>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_as(BY_NAME)
        .bind(name)
        .fetch_optional(c)
        .await?))
}

/// Whether any key was ever made (a revoked one counts).
async fn any(conn: Conn<'_>) -> Result<bool, StoreError> {
    let n: i64 = on_conn!(conn, c => sqlx::query_scalar(ANY).fetch_one(c).await?);
    Ok(n > 0)
}

/// Every key, oldest first.
async fn all_keys(conn: Conn<'_>) -> Result<Vec<Listed>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_as(LIST).fetch_all(c).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_the_prefix_and_64_hex_digits_and_never_repeats() {
        let a = generate_key().unwrap();
        let b = generate_key().unwrap();
        assert_eq!(a.len(), 3 + 64);
        assert!(a.starts_with("ck_"));
        assert!(a[3..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn the_hash_is_the_sha256_in_hex() {
        // echo -n abc | sha256sum
        assert_eq!(
            KeyHash::of("abc").as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(KeyHash::of("abc").matches(KeyHash::of("abc").as_str()));
        assert!(!KeyHash::of("abc").matches(KeyHash::of("abd").as_str()));
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("shop-1.eu_west").is_ok());
        assert!(valid_name("").is_err());
        assert!(valid_name("-x").is_err());
        assert!(valid_name("a b").is_err());
        assert!(valid_name(&"a".repeat(65)).is_err());
    }
}
