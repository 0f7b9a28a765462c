use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgPool;

use super::{Fingerprint, Lease, Record, RecordStore, Saved, millis};
use crate::db::StoreError;

/// Records in Postgres, timed by the database's clock, so that instances whose clocks
/// disagree still agree on when a lease lapses.
#[derive(Clone, Debug)]
pub struct PgRecords {
    pool: PgPool,
}

impl PgRecords {
    pub fn new(pool: PgPool) -> Self {
        PgRecords { pool }
    }
}

impl RecordStore for PgRecords {
    async fn insert(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Option<i64>, StoreError> {
        const SQL: &str = "INSERT INTO idempotency_keys (scope, key, fingerprint, fence, lease_until, created_at, expires_at) VALUES ($1, $2, $3, 1, now() + $4::float8 * interval '1 millisecond', now(), now() + $5::float8 * interval '1 millisecond') ON CONFLICT (scope, key) DO NOTHING RETURNING fence";
        Ok(sqlx::query_scalar(SQL)
            .bind(scope)
            .bind(key)
            .bind(fingerprint.as_str())
            .bind(millis(lease))
            .bind(millis(ttl))
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn read(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(
            "SELECT fingerprint, fence, status, content_type, body, \
             COALESCE(GREATEST(0, CAST(EXTRACT(EPOCH FROM (lease_until - now())) * 1000 AS BIGINT)), 0) AS lease_left_ms, \
             expires_at <= now() AS expired \
             FROM idempotency_keys WHERE scope = $1 AND key = $2",
        )
        .bind(scope)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let saved = Saved::from_columns(
            row.try_get::<Option<i32>, _>("status")?.map(i64::from),
            row.try_get("content_type")?,
            row.try_get("body")?,
        )?;
        Ok(Some(Record {
            fingerprint: row.try_get("fingerprint")?,
            fence: row.try_get("fence")?,
            saved,
            lease_left: Duration::from_millis(row.try_get::<i64, _>("lease_left_ms")?.max(0) as u64),
            expired: row.try_get("expired")?,
        }))
    }

    async fn forget_expired(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND expires_at <= now()",
        )
        .bind(scope)
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn take_over(
        &self,
        scope: &str,
        key: &str,
        fence: i64,
        lease: Duration,
    ) -> Result<Option<i64>, StoreError> {
        const SQL: &str = "UPDATE idempotency_keys SET fence = fence + 1, lease_until = now() + $4::float8 * interval '1 millisecond' WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL AND lease_until <= now() RETURNING fence";
        Ok(sqlx::query_scalar(SQL)
            .bind(scope)
            .bind(key)
            .bind(fence)
            .bind(millis(lease))
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<bool, StoreError> {
        const SQL: &str = "UPDATE idempotency_keys SET lease_until = now() + $4::float8 * interval '1 millisecond' WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL";
        let done = sqlx::query(SQL)
            .bind(&lease.scope)
            .bind(&lease.key)
            .bind(lease.fence)
            .bind(millis(lease_for))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn complete(&self, lease: &Lease, saved: &Saved) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE idempotency_keys SET status = $4, content_type = $5, body = $6, lease_until = NULL \
             WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL",
        )
        .bind(&lease.scope)
        .bind(&lease.key)
        .bind(lease.fence)
        .bind(i32::from(saved.status))
        .bind(&saved.content_type)
        .bind(&saved.body)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, lease: &Lease) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE idempotency_keys SET lease_until = now() \
             WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL",
        )
        .bind(&lease.scope)
        .bind(&lease.key)
        .bind(lease.fence)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM idempotency_keys WHERE expires_at <= now()")
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
