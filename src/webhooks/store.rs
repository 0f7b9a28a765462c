//! The deliverer's statements on `webhook_events` and `webhook_endpoints`: claims under a
//! lease (any instance's deliverer takes a row whose lease lapsed), and the outcomes,
//! recorded only by the holder of the claim. Only Postgres's `FOR UPDATE SKIP LOCKED` is
//! split.

use crate::db::{Conn, Database, StoreError, on_conn};

/// An event a deliverer claimed: what to send, and the claim that records its outcome.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Claimed {
    pub id: String,
    pub body: String,
    /// Delivery attempts begun, this one included.
    pub attempts: i64,
    pub claim: i64,
}

/// The events of the database, as the deliverer sees them.
#[derive(Clone, Debug)]
pub struct Deliveries {
    db: Database,
}

/// What waits: events not yet delivered nor given up, and the age of the oldest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    pub pending: i64,
    pub oldest_age_ms: i64,
}

impl Deliveries {
    pub fn new(db: &Database) -> Deliveries {
        Deliveries { db: db.clone() }
    }

    /// Claims up to `limit` due events of the `types` (separated by commas), each for
    /// `lease_ms`, unless `url` is disabled.
    pub async fn claim(
        &self,
        url: &str,
        types: &str,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        let mut conn = self.db.acquire().await?;
        Ok(match conn.conn() {
            Conn::Postgres(c) => {
                sqlx::query_as(PG_CLAIM)
                    .bind(lease_ms)
                    .bind(limit)
                    .bind(url)
                    .bind(types)
                    .fetch_all(c)
                    .await?
            }
            Conn::Sqlite(c) => {
                sqlx::query_as(SQLITE_CLAIM)
                    .bind(lease_ms)
                    .bind(limit)
                    .bind(url)
                    .bind(types)
                    .fetch_all(c)
                    .await?
            }
        })
    }

    /// The endpoint took it (2xx): delivered, whoever holds the claim now.
    pub async fn delivered(&self, row: &Claimed) -> Result<(), StoreError> {
        let mut conn = self.db.acquire().await?;
        on_conn!(conn.conn(), c => sqlx::query(DELIVERED)
            .bind(&row.id)
            .execute(c)
            .await
            .map(drop))?;
        Ok(())
    }

    /// Not taken: due again in `delay_ms`, if the claim is still ours.
    pub async fn retry_later(
        &self,
        row: &Claimed,
        error: &str,
        delay_ms: i64,
    ) -> Result<(), StoreError> {
        let mut conn = self.db.acquire().await?;
        on_conn!(conn.conn(), c => sqlx::query(RETRY)
            .bind(&row.id)
            .bind(row.claim)
            .bind(error)
            .bind(delay_ms)
            .execute(c)
            .await
            .map(drop))?;
        Ok(())
    }

    /// Out of attempts: recorded failed, never sent again.
    pub async fn failed(&self, row: &Claimed, error: &str) -> Result<(), StoreError> {
        let mut conn = self.db.acquire().await?;
        on_conn!(conn.conn(), c => sqlx::query(FAILED)
            .bind(&row.id)
            .bind(row.claim)
            .bind(error)
            .execute(c)
            .await
            .map(drop))?;
        Ok(())
    }

    /// The endpoint answered 410 Gone: disabled for every instance; the event's claim is
    /// given back (it stays pending, and goes to an endpoint configured in its place).
    pub async fn disable(&self, url: &str, row: &Claimed, reason: &str) -> Result<(), StoreError> {
        let mut conn = self.db.acquire().await?;
        on_conn!(conn.conn(), c => sqlx::query(DISABLE)
            .bind(url)
            .bind(reason)
            .execute(&mut *c)
            .await
            .map(drop))?;
        self.retry_later(row, reason, 0).await
    }

    /// Whether `url` answered 410 Gone.
    pub async fn disabled(&self, url: &str) -> Result<bool, StoreError> {
        let mut conn = self.db.acquire().await?;
        let n: i64 = on_conn!(conn.conn(), c => sqlx::query_scalar(DISABLED)
            .bind(url)
            .fetch_one(c)
            .await?);
        Ok(n > 0)
    }

    /// The events of the `types` (separated by commas) waiting, across every instance.
    pub async fn backlog(&self, types: &str) -> Result<Backlog, StoreError> {
        let mut conn = self.db.acquire().await?;
        let (pending, oldest_age_ms): (i64, i64) = on_conn!(conn.conn(), c => sqlx::query_as(BACKLOG)
            .bind(types)
            .fetch_one(c)
            .await?);
        Ok(Backlog {
            pending,
            oldest_age_ms,
        })
    }
}

/// The claim (`$1` lease, `$2` limit, `$3` the endpoint, `$4` its types), with the row lock Postgres takes
/// (`$lock`): concurrent deliverers skip each other's rows instead of waiting.
macro_rules! claim {
    ($lock:literal) => {
        concat!(
            "UPDATE webhook_events SET claim = claim + 1, attempts = attempts + 1, ",
            "claimed_until = (SELECT now_ms FROM clock) + $1 ",
            "WHERE id IN (SELECT id FROM webhook_events ",
            "WHERE status = 'pending' AND next_attempt_at <= (SELECT now_ms FROM clock) ",
            "AND (claimed_until IS NULL OR claimed_until <= (SELECT now_ms FROM clock)) ",
            "AND NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE url = $3) ",
            "AND (',' || CAST($4 AS TEXT) || ',') LIKE ('%,' || type || ',%') ",
            "ORDER BY next_attempt_at, id LIMIT $2",
            $lock,
            ") RETURNING id, body, attempts, claim"
        )
    };
}
const PG_CLAIM: &str = claim!(" FOR UPDATE SKIP LOCKED");
const SQLITE_CLAIM: &str = claim!("");

const DELIVERED: &str = "\
    UPDATE webhook_events SET status = 'delivered', delivered_at = (SELECT now_ms FROM clock), \
    claimed_until = NULL WHERE id = $1 AND status = 'pending'";
const RETRY: &str = "\
    UPDATE webhook_events SET claimed_until = NULL, last_error = $3, \
    next_attempt_at = (SELECT now_ms FROM clock) + $4 \
    WHERE id = $1 AND claim = $2 AND status = 'pending'";
const FAILED: &str = "\
    UPDATE webhook_events SET status = 'failed', claimed_until = NULL, last_error = $3 \
    WHERE id = $1 AND claim = $2 AND status = 'pending'";
const DISABLE: &str = "\
    INSERT INTO webhook_endpoints (url, disabled_at, reason) \
    SELECT $1, now_ms, $2 FROM clock WHERE true ON CONFLICT (url) DO NOTHING";
const DISABLED: &str = "SELECT COUNT(*) FROM webhook_endpoints WHERE url = $1";
const BACKLOG: &str = "\
    SELECT COUNT(*), COALESCE(MAX(now_ms - created_at), 0) FROM webhook_events, clock \
    WHERE status = 'pending' AND (',' || CAST($1 AS TEXT) || ',') LIKE ('%,' || type || ',%')";
