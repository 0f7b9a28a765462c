use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::Row;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use uuid::Uuid;

use super::{NewReceipt, Receipt, ReceiptStore, receipt_from_columns, settle};
use crate::db::StoreError;
use crate::payments::keys::{ChargeKey, OperationKey, OrderId};
use crate::payments::money::Money;
use crate::payments::store::ChargeOutcome;

/// Receipts in SQLite. Ids and times are stored as text (hyphenated UUID, RFC 3339 UTC
/// with microseconds), so that an operator's `sqlite3 checkout.db` shows what Postgres shows.
#[derive(Clone, Debug)]
pub struct SqliteReceipts {
    pool: SqlitePool,
}

impl SqliteReceipts {
    pub fn new(pool: SqlitePool) -> Self {
        SqliteReceipts { pool }
    }
}

const INSERT: &str = "\
    INSERT INTO receipts (id, order_id, amount_minor, currency, operation_key, created_at) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
    ON CONFLICT (order_id) DO NOTHING \
    RETURNING id, order_id, amount_minor, currency, operation_key, created_at";

const SELECT: &str = "\
    SELECT id, order_id, amount_minor, currency, operation_key, created_at \
    FROM receipts WHERE order_id = ?1";

impl ReceiptStore for SqliteReceipts {
    async fn charge(
        &self,
        key: &ChargeKey,
        amount: Money,
        operation: &OperationKey,
    ) -> Result<ChargeOutcome, StoreError> {
        let new = NewReceipt::now();
        // Taken apart from the statement so that a failure here is known not to charge.
        let mut conn = self.pool.acquire().await.map_err(StoreError::unreachable)?;
        let inserted = sqlx::query(INSERT)
            .bind(new.id.to_string())
            .bind(key.order_id().as_str())
            .bind(amount.minor())
            .bind(amount.currency().code())
            .bind(operation.as_str())
            .bind(new.created_at.to_rfc3339_opts(SecondsFormat::Micros, true))
            .fetch_optional(&mut *conn)
            .await?;
        drop(conn);
        let inserted = inserted.as_ref().map(from_row).transpose()?;
        settle(inserted, key, amount, self.receipt(key.order_id())).await
    }

    async fn receipt(&self, order: &OrderId) -> Result<Option<Receipt>, StoreError> {
        let row = sqlx::query(SELECT)
            .bind(order.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(from_row).transpose()
    }
}

fn from_row(row: &SqliteRow) -> Result<Receipt, StoreError> {
    let id: &str = row.try_get("id")?;
    let id =
        Uuid::parse_str(id).map_err(|e| StoreError::Corrupt(format!("receipt id {id:?}: {e}")))?;
    let created_at: &str = row.try_get("created_at")?;
    let created_at = DateTime::parse_from_rfc3339(created_at)
        .map_err(|e| StoreError::Corrupt(format!("receipt {id} created_at {created_at:?}: {e}")))?
        .with_timezone(&Utc);
    receipt_from_columns(
        id,
        row.try_get::<&str, _>("order_id")?,
        row.try_get::<i64, _>("amount_minor")?,
        row.try_get::<&str, _>("currency")?,
        row.try_get::<String, _>("operation_key")?,
        created_at,
    )
}
