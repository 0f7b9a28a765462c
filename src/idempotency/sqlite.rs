use std::time::{Duration, SystemTime};

use sqlx::Row;
use sqlx::sqlite::SqlitePool;

use super::{Fingerprint, Lease, Record, RecordStore, Saved, millis};
use crate::db::StoreError;

/// Records in SQLite, timed in milliseconds since the Unix epoch by this process's
/// clock: SQLite serves one process, so there is no other clock to disagree with.
#[derive(Clone, Debug)]
pub struct SqliteRecords {
    pool: SqlitePool,
}

impl SqliteRecords {
    pub fn new(pool: SqlitePool) -> Self {
        SqliteRecords { pool }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(millis)
        .unwrap_or_default()
}

impl RecordStore for SqliteRecords {
    async fn insert(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let now = now_ms();
        Ok(sqlx::query_scalar(
            "INSERT INTO idempotency_keys (scope, key, fingerprint, fence, lease_until, created_at, expires_at) \
             VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6) \
             ON CONFLICT (scope, key) DO NOTHING RETURNING fence",
        )
        .bind(scope)
        .bind(key)
        .bind(fingerprint.as_str())
        .bind(now.saturating_add(millis(lease)))
        .bind(now)
        .bind(now.saturating_add(millis(ttl)))
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn read(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(
            "SELECT fingerprint, fence, status, content_type, body, lease_until, expires_at \
             FROM idempotency_keys WHERE scope = ?1 AND key = ?2",
        )
        .bind(scope)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let now = now_ms();
        let saved = Saved::from_columns(
            row.try_get::<Option<i64>, _>("status")?,
            row.try_get("content_type")?,
            row.try_get("body")?,
        )?;
        let lease_until: Option<i64> = row.try_get("lease_until")?;
        let lease_left = lease_until.map_or(0, |until| (until - now).max(0));
        Ok(Some(Record {
            fingerprint: row.try_get("fingerprint")?,
            fence: row.try_get("fence")?,
            saved,
            lease_left: Duration::from_millis(lease_left as u64),
            expired: row.try_get::<i64, _>("expires_at")? <= now,
        }))
    }

    async fn forget_expired(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM idempotency_keys WHERE scope = ?1 AND key = ?2 AND expires_at <= ?3",
        )
        .bind(scope)
        .bind(key)
        .bind(now_ms())
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
        let now = now_ms();
        Ok(sqlx::query_scalar(
            "UPDATE idempotency_keys SET fence = fence + 1, lease_until = ?4 \
             WHERE scope = ?1 AND key = ?2 AND fence = ?3 AND status IS NULL AND lease_until <= ?5 \
             RETURNING fence",
        )
        .bind(scope)
        .bind(key)
        .bind(fence)
        .bind(now.saturating_add(millis(lease)))
        .bind(now)
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE idempotency_keys SET lease_until = ?4 \
             WHERE scope = ?1 AND key = ?2 AND fence = ?3 AND status IS NULL",
        )
        .bind(&lease.scope)
        .bind(&lease.key)
        .bind(lease.fence)
        .bind(now_ms().saturating_add(millis(lease_for)))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn complete(&self, lease: &Lease, saved: &Saved) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE idempotency_keys SET status = ?4, content_type = ?5, body = ?6, lease_until = NULL \
             WHERE scope = ?1 AND key = ?2 AND fence = ?3 AND status IS NULL",
        )
        .bind(&lease.scope)
        .bind(&lease.key)
        .bind(lease.fence)
        .bind(i64::from(saved.status))
        .bind(&saved.content_type)
        .bind(&saved.body)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, lease: &Lease) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE idempotency_keys SET lease_until = ?4 \
             WHERE scope = ?1 AND key = ?2 AND fence = ?3 AND status IS NULL",
        )
        .bind(&lease.scope)
        .bind(&lease.key)
        .bind(lease.fence)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM idempotency_keys WHERE expires_at <= ?1")
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
