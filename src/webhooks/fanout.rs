//! The deliveries to the endpoints of `webhook_subscriptions`: one row of
//! `webhook_deliveries` per event and endpoint that takes its type, made by any instance's
//! deliverer from the events not yet fanned out (`ON CONFLICT DO NOTHING`: racing
//! instances make one row per pair), then claimed under a lease and recorded as
//! CHECKOUT_WEBHOOK_URL's are in `webhook_events`, each with its own attempts and retries.

use super::endpoints::Endpoint;
use crate::db::{Conn, Database, StoreError, on_conn};

/// A delivery claimed for one attempt.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ClaimedDelivery {
    pub event_id: String,
    pub subscription: String,
    pub attempts: i64,
    pub claim: i64,
}

/// `webhook_deliveries`, in the service's database.
#[derive(Clone, Debug)]
pub struct Fanout {
    db: Database,
}

impl Fanout {
    pub fn new(db: &Database) -> Fanout {
        Fanout { db: db.clone() }
    }

    /// Makes the deliveries of up to `limit` events not yet fanned out, to the enabled
    /// `endpoints` that take their type and were added before them; the number of events
    /// fanned out.
    pub async fn fan_out(&self, endpoints: &[Endpoint], limit: i64) -> Result<usize, StoreError> {
        let enabled: Vec<&Endpoint> = endpoints
            .iter()
            .filter(|e| e.disabled_at.is_none())
            .collect();
        let Some(oldest) = enabled.iter().map(|e| e.created_at).min() else {
            return Ok(0);
        };
        let mut conn = self.db.acquire().await?;
        on_conn!(conn.conn(), c => sqlx::query(SKIP_OLDER).bind(oldest).execute(&mut *c).await.map(drop))?;
        let events: Vec<(String, String, i64)> = on_conn!(conn.conn(), c => sqlx::query_as(UNFANNED)
            .bind(limit)
            .fetch_all(c)
            .await?);
        for (id, kind, created_at) in &events {
            let kind = super::EventType::parse(kind);
            for endpoint in &enabled {
                let takes = kind.is_some_and(|k| endpoint.events.wants(k));
                if takes && endpoint.created_at <= *created_at {
                    insert(conn.conn(), id, &endpoint.id).await?;
                }
            }
            on_conn!(conn.conn(), c => sqlx::query(FANNED).bind(id).execute(c).await.map(drop))?;
        }
        Ok(events.len())
    }

    /// Up to `limit` deliveries due, to enabled endpoints, claimed for `lease_ms`.
    pub async fn claim(
        &self,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let mut conn = self.db.acquire().await?;
        Ok(match conn.conn() {
            Conn::Postgres(c) => {
                sqlx::query_as(PG_CLAIM)
                    .bind(lease_ms)
                    .bind(limit)
                    .fetch_all(c)
                    .await?
            }
            Conn::Sqlite(c) => {
                sqlx::query_as(SQLITE_CLAIM)
                    .bind(lease_ms)
                    .bind(limit)
                    .fetch_all(c)
                    .await?
            }
        })
    }

    /// The body of the event `id`.
    pub async fn body(&self, id: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.db.acquire().await?;
        Ok(on_conn!(conn.conn(), c => sqlx::query_scalar(BODY).bind(id).fetch_optional(c).await?))
    }

    pub async fn delivered(&self, row: &ClaimedDelivery) -> Result<(), StoreError> {
        let mut conn = self.db.acquire().await?;
        on_conn!(conn.conn(), c => sqlx::query(DELIVERED)
            .bind(&row.event_id)
            .bind(&row.subscription)
            .execute(c)
            .await
            .map(drop))?;
        Ok(())
    }

    /// Not taken: due again in `delay_ms`, if the claim is still ours.
    pub async fn retry_later(
        &self,
        row: &ClaimedDelivery,
        error: &str,
        delay_ms: i64,
    ) -> Result<(), StoreError> {
        let mut conn = self.db.acquire().await?;
        on_conn!(conn.conn(), c => sqlx::query(RETRY)
            .bind(&row.event_id)
            .bind(&row.subscription)
            .bind(row.claim)
            .bind(error)
            .bind(delay_ms)
            .execute(c)
            .await
            .map(drop))?;
        Ok(())
    }

    /// Out of attempts: recorded failed, never sent again.
    pub async fn failed(&self, row: &ClaimedDelivery, error: &str) -> Result<(), StoreError> {
        let mut conn = self.db.acquire().await?;
        on_conn!(conn.conn(), c => sqlx::query(FAILED)
            .bind(&row.event_id)
            .bind(&row.subscription)
            .bind(row.claim)
            .bind(error)
            .execute(c)
            .await
            .map(drop))?;
        Ok(())
    }

    /// The endpoint answered 410 Gone: it alone is disabled, its deliveries left pending.
    pub async fn disable(&self, row: &ClaimedDelivery, reason: &str) -> Result<(), StoreError> {
        let mut conn = self.db.acquire().await?;
        on_conn!(conn.conn(), c => sqlx::query(DISABLE)
            .bind(&row.subscription)
            .bind(reason)
            .execute(c)
            .await
            .map(drop))?;
        drop(conn);
        self.retry_later(row, reason, 0).await
    }

    /// Deliveries pending to enabled endpoints, and the oldest's age.
    pub async fn backlog(&self) -> Result<(i64, i64), StoreError> {
        let mut conn = self.db.acquire().await?;
        Ok(on_conn!(conn.conn(), c => sqlx::query_as(BACKLOG).fetch_one(c).await?))
    }
}

async fn insert(conn: Conn<'_>, event: &str, endpoint: &str) -> Result<(), StoreError> {
    on_conn!(conn, c => sqlx::query(INSERT).bind(event).bind(endpoint).execute(c).await.map(drop))?;
    Ok(())
}

/// Events older than every endpoint go to none: marked fanned out at once.
const SKIP_OLDER: &str = "\
    UPDATE webhook_events SET fanned_at = (SELECT now_ms FROM clock) \
    WHERE fanned_at IS NULL AND created_at < $1";
const UNFANNED: &str = "\
    SELECT id, type, created_at FROM webhook_events WHERE fanned_at IS NULL \
    ORDER BY created_at, id LIMIT $1";
const INSERT: &str = "\
    INSERT INTO webhook_deliveries (event_id, subscription, next_attempt_at, created_at) \
    SELECT $1, $2, now_ms, now_ms FROM clock WHERE true ON CONFLICT DO NOTHING";
const FANNED: &str = "\
    UPDATE webhook_events SET fanned_at = (SELECT now_ms FROM clock) WHERE id = $1";
const BODY: &str = "SELECT body FROM webhook_events WHERE id = $1";

/// The claim (`$1` lease, `$2` limit), with Postgres's row lock (`$lock`).
macro_rules! claim {
    ($lock:literal) => {
        concat!(
            "UPDATE webhook_deliveries SET claim = claim + 1, attempts = attempts + 1, ",
            "claimed_until = (SELECT now_ms FROM clock) + $1 ",
            "WHERE (event_id, subscription) IN (SELECT d.event_id, d.subscription ",
            "FROM webhook_deliveries d JOIN webhook_subscriptions s ON s.id = d.subscription ",
            "WHERE d.status = 'pending' AND s.disabled_at IS NULL ",
            "AND d.next_attempt_at <= (SELECT now_ms FROM clock) ",
            "AND (d.claimed_until IS NULL OR d.claimed_until <= (SELECT now_ms FROM clock)) ",
            "ORDER BY d.next_attempt_at, d.event_id LIMIT $2",
            $lock,
            ") RETURNING event_id, subscription, attempts, claim"
        )
    };
}
const PG_CLAIM: &str = claim!(" FOR UPDATE OF d SKIP LOCKED");
const SQLITE_CLAIM: &str = claim!("");

// `$1` event, `$2` endpoint, `$3` claim (the fence), `$4` error, `$5` delay.
const DELIVERED: &str = "\
    UPDATE webhook_deliveries SET status = 'delivered', delivered_at = (SELECT now_ms FROM clock), \
    claimed_until = NULL WHERE event_id = $1 AND subscription = $2 AND status = 'pending'";
const RETRY: &str = "\
    UPDATE webhook_deliveries SET claimed_until = NULL, last_error = $4, \
    next_attempt_at = (SELECT now_ms FROM clock) + $5 \
    WHERE event_id = $1 AND subscription = $2 AND claim = $3 AND status = 'pending'";
const FAILED: &str = "\
    UPDATE webhook_deliveries SET status = 'failed', claimed_until = NULL, last_error = $4 \
    WHERE event_id = $1 AND subscription = $2 AND claim = $3 AND status = 'pending'";
const DISABLE: &str = "\
    UPDATE webhook_subscriptions SET disabled_at = (SELECT now_ms FROM clock), reason = $2 \
    WHERE id = $1 AND disabled_at IS NULL";
const BACKLOG: &str = "\
    SELECT COUNT(*), COALESCE(MAX(now_ms - d.created_at), 0) \
    FROM webhook_deliveries d JOIN webhook_subscriptions s ON s.id = d.subscription, clock \
    WHERE d.status = 'pending' AND s.disabled_at IS NULL";
