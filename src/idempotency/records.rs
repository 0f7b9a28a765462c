//! The `idempotency_keys` table: one row per key, with its lease, fence and saved answer.
//! Every statement is one text for both databases, timed by their `clock` view.

use std::time::Duration;

use crate::db::{Conn, StoreError, on_conn};

/// The right to work on a key, until the lease lapses or another instance takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub caller: String,
    pub key: String,
    pub fence: i64,
}

/// A finished answer, kept for replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// A record as read, with its times already compared against the database's clock.
#[derive(Debug)]
pub struct Record {
    pub fingerprint: String,
    pub fence: i64,
    pub saved: Option<Saved>,
    /// How long the lease still runs (zero when it has lapsed).
    pub lease_left: Duration,
    pub expired: bool,
}

const INSERT: &str = "\
    INSERT INTO idempotency_keys (scope, key, fingerprint, fence, lease_until, created_at, expires_at, request) \
    SELECT $1, $2, $3, 1, now_ms + $4, now_ms, now_ms + $5, $6 FROM clock WHERE true \
    ON CONFLICT (scope, key) DO NOTHING RETURNING fence";

const READ: &str = "\
    SELECT fingerprint, fence, status, content_type, body, lease_until, expires_at, now_ms \
    FROM idempotency_keys, clock WHERE scope = $1 AND key = $2";

const FORGET_EXPIRED: &str = "\
    DELETE FROM idempotency_keys \
    WHERE scope = $1 AND key = $2 AND expires_at <= (SELECT now_ms FROM clock)";

const TAKE_OVER: &str = "\
    UPDATE idempotency_keys SET fence = fence + 1, lease_until = (SELECT now_ms FROM clock) + $4 \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL \
    AND lease_until <= (SELECT now_ms FROM clock) \
    RETURNING fence";

const RENEW: &str = "\
    UPDATE idempotency_keys SET lease_until = (SELECT now_ms FROM clock) + $4 \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL";

const COMPLETE: &str = "\
    UPDATE idempotency_keys SET status = $4, content_type = $5, body = $6, lease_until = NULL \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL";

const RELEASE: &str = "\
    UPDATE idempotency_keys SET lease_until = (SELECT now_ms FROM clock) \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL";

const SWEEP: &str = "DELETE FROM idempotency_keys WHERE expires_at <= (SELECT now_ms FROM clock)";

/// Unfinished records whose lease lapsed at least `$1` ms ago, and the sweep has not
/// given up on: the recovery sweep's candidates.
const LAPSED: &str = "\
    SELECT scope, key, fence, request, recoveries FROM idempotency_keys, clock \
    WHERE status IS NULL AND lease_until <= now_ms - $1 AND expires_at > now_ms \
    AND attention_at IS NULL AND request IS NOT NULL ORDER BY lease_until LIMIT $2";

/// A takeover by the recovery sweep: as the client's retry takes one (a new fence), and
/// counted, while fewer than `$5` recoveries were tried.
const RECOVER: &str = "\
    UPDATE idempotency_keys SET fence = fence + 1, recoveries = recoveries + 1, \
    lease_until = (SELECT now_ms FROM clock) + $4 \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL AND attention_at IS NULL \
    AND recoveries < $5 AND lease_until <= (SELECT now_ms FROM clock) \
    RETURNING fence";

/// The sweep gives up on a record it recovered `$4` times: it needs an operator.
const GIVE_UP: &str = "\
    UPDATE idempotency_keys SET attention_at = (SELECT now_ms FROM clock) \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL AND attention_at IS NULL \
    AND recoveries >= $4 AND lease_until <= (SELECT now_ms FROM clock)";

/// An unfinished operation whose lease lapsed.
#[derive(Debug, sqlx::FromRow)]
pub struct Lapsed {
    /// The caller (its column keeps its first name, `scope`).
    #[sqlx(rename = "scope")]
    pub caller: String,
    pub key: String,
    pub fence: i64,
    /// What it was asked, as its handler recorded it.
    pub request: String,
    /// Times the recovery sweep took it over already.
    pub recoveries: i64,
}

/// Up to `limit` operations whose lease lapsed at least `grace` ago.
pub async fn lapsed(
    conn: Conn<'_>,
    grace: Duration,
    limit: i64,
) -> Result<Vec<Lapsed>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_as(LAPSED)
        .bind(millis(grace))
        .bind(limit)
        .fetch_all(c)
        .await?))
}

/// Takes a lapsed operation over for the recovery sweep: its new lease, or `None` when
/// someone else got there first (or it is out of recoveries).
pub async fn recover(
    conn: Conn<'_>,
    lapsed: &Lapsed,
    lease: Duration,
    max: i64,
) -> Result<Option<Lease>, StoreError> {
    let fence: Option<i64> = on_conn!(conn, c => sqlx::query_scalar(RECOVER)
        .bind(&lapsed.caller)
        .bind(&lapsed.key)
        .bind(lapsed.fence)
        .bind(millis(lease))
        .bind(max)
        .fetch_optional(c)
        .await?);
    Ok(fence.map(|fence| Lease {
        caller: lapsed.caller.clone(),
        key: lapsed.key.clone(),
        fence,
    }))
}

/// Marks an operation the sweep recovered `max` times as needing attention; true when
/// this call marked it.
pub async fn give_up(conn: Conn<'_>, lapsed: &Lapsed, max: i64) -> Result<bool, StoreError> {
    let done = on_conn!(conn, c => sqlx::query(GIVE_UP)
        .bind(&lapsed.caller)
        .bind(&lapsed.key)
        .bind(lapsed.fence)
        .bind(max)
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// Inserts a fresh record with fence 1, unless the key exists. The fence, if inserted.
/// `request` is what the recovery sweep rebuilds the operation from.
pub async fn insert(
    conn: Conn<'_>,
    caller: &str,
    key: &str,
    fingerprint: &str,
    request: &str,
    lease: Duration,
    ttl: Duration,
) -> Result<Option<i64>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_scalar(INSERT)
        .bind(caller)
        .bind(key)
        .bind(fingerprint)
        .bind(millis(lease))
        .bind(millis(ttl))
        .bind(request)
        .fetch_optional(c)
        .await?))
}

pub async fn read(conn: Conn<'_>, caller: &str, key: &str) -> Result<Option<Record>, StoreError> {
    let row: Option<Stored> = on_conn!(conn, c => sqlx::query_as(READ)
        .bind(caller)
        .bind(key)
        .fetch_optional(c)
        .await?);
    row.map(Stored::into_record).transpose()
}

/// Deletes the record if it has expired.
pub async fn forget_expired(conn: Conn<'_>, caller: &str, key: &str) -> Result<(), StoreError> {
    on_conn!(conn, c => sqlx::query(FORGET_EXPIRED)
        .bind(caller)
        .bind(key)
        .execute(c)
        .await
        .map(drop))?;
    Ok(())
}

/// Takes over an unfinished record whose lease lapsed, if its fence is still `fence`:
/// the new fence, or `None` when someone else got there first.
pub async fn take_over(
    conn: Conn<'_>,
    caller: &str,
    key: &str,
    fence: i64,
    lease: Duration,
) -> Result<Option<i64>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_scalar(TAKE_OVER)
        .bind(caller)
        .bind(key)
        .bind(fence)
        .bind(millis(lease))
        .fetch_optional(c)
        .await?))
}

/// Extends the lease; false when it is no longer ours.
pub async fn renew(conn: Conn<'_>, lease: &Lease, lease_for: Duration) -> Result<bool, StoreError> {
    let done = on_conn!(conn, c => sqlx::query(RENEW)
        .bind(&lease.caller)
        .bind(&lease.key)
        .bind(lease.fence)
        .bind(millis(lease_for))
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// Saves the answer; false when the lease is no longer ours (nothing is written).
pub async fn complete(conn: Conn<'_>, lease: &Lease, saved: &Saved) -> Result<bool, StoreError> {
    let done = on_conn!(conn, c => sqlx::query(COMPLETE)
        .bind(&lease.caller)
        .bind(&lease.key)
        .bind(lease.fence)
        .bind(i64::from(saved.status))
        .bind(&saved.content_type)
        .bind(&saved.body)
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// Ends the lease now without an answer, so the next request runs the operation again.
pub async fn release(conn: Conn<'_>, lease: &Lease) -> Result<bool, StoreError> {
    let done = on_conn!(conn, c => sqlx::query(RELEASE)
        .bind(&lease.caller)
        .bind(&lease.key)
        .bind(lease.fence)
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// Deletes expired records; how many.
pub async fn sweep(conn: Conn<'_>) -> Result<u64, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query(SWEEP).execute(c).await?.rows_affected()))
}

/// A row as both databases return it, with the database's time beside it.
#[derive(sqlx::FromRow)]
struct Stored {
    fingerprint: String,
    fence: i64,
    status: Option<i64>,
    content_type: Option<String>,
    body: Option<Vec<u8>>,
    lease_until: Option<i64>,
    expires_at: i64,
    now_ms: i64,
}

impl Stored {
    fn into_record(self) -> Result<Record, StoreError> {
        let saved = match self.status {
            None => None,
            Some(status) => Some(Saved {
                status: u16::try_from(status)
                    .map_err(|_| StoreError::Corrupt(format!("saved status {status}")))?,
                content_type: self.content_type.unwrap_or_default(),
                body: self.body.unwrap_or_default(),
            }),
        };
        let lease_left = self
            .lease_until
            .map_or(0, |until| until - self.now_ms)
            .max(0);
        Ok(Record {
            fingerprint: self.fingerprint,
            fence: self.fence,
            saved,
            lease_left: Duration::from_millis(lease_left as u64),
            expired: self.expires_at <= self.now_ms,
        })
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
