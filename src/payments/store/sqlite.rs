use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::sqlite::{Sqlite, SqlitePool, SqliteRow};
use sqlx::{QueryBuilder, Row as _};
use uuid::Uuid;

use super::group::{GroupWriter, InsertGroup, Row};
use super::{Receipt, ReceiptStore, receipt_from_columns, settle};
use crate::db::StoreError;
use crate::payments::keys::{ChargeKey, OperationKey, OrderId};
use crate::payments::money::Money;
use crate::payments::store::ChargeOutcome;

/// Receipts in SQLite. Ids and times are stored as text (hyphenated UUID, RFC 3339 UTC
/// with microseconds), so that an operator's `sqlite3 checkout.db` shows what Postgres shows.
#[derive(Clone, Debug)]
pub struct SqliteReceipts {
    pool: SqlitePool,
    writer: GroupWriter,
}

impl SqliteReceipts {
    /// Starts the store's writer task; it ends when the last clone of the store is dropped.
    pub fn new(pool: SqlitePool) -> Self {
        SqliteReceipts {
            writer: GroupWriter::start(SqliteGroups { pool: pool.clone() }, pool.close_event()),
            pool,
        }
    }
}

const INSERT: &str =
    "INSERT INTO receipts (id, order_id, amount_minor, currency, operation_key, created_at) ";

const ON_CONFLICT: &str = " ON CONFLICT (order_id) DO NOTHING \
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
        let inserted = self.writer.insert(key, amount, operation).await?;
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

struct SqliteGroups {
    pool: SqlitePool,
}

impl InsertGroup for SqliteGroups {
    /// A multi-row `VALUES`: SQLite prepares a statement in microseconds, in process. The
    /// connection goes back to the pool after every group: it is the only one.
    async fn insert(&mut self, rows: &[Row]) -> Result<Vec<Receipt>, StoreError> {
        // Taken apart from the statement so that a failure here is known not to charge.
        let mut conn = self.pool.acquire().await.map_err(StoreError::unreachable)?;
        let mut statement = QueryBuilder::<Sqlite>::new(INSERT);
        statement.push_values(rows, |mut values, row| {
            values
                .push_bind(row.id.to_string())
                .push_bind(row.order_id.clone())
                .push_bind(row.amount.minor())
                .push_bind(row.amount.currency().code())
                .push_bind(row.operation_key.clone())
                .push_bind(row.created_at.to_rfc3339_opts(SecondsFormat::Micros, true));
        });
        statement.push(ON_CONFLICT);
        let inserted = statement.build().fetch_all(&mut *conn).await?;
        inserted.iter().map(from_row).collect()
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
