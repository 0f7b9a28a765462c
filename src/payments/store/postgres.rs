use chrono::{DateTime, Utc};
use sqlx::Row as _;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgRow, Postgres};
use uuid::Uuid;

use super::group::{GroupWriter, InsertGroup, Row};
use super::{Receipt, ReceiptStore, receipt_from_columns, settle};
use crate::db::StoreError;
use crate::payments::keys::{ChargeKey, OperationKey, OrderId};
use crate::payments::money::Money;
use crate::payments::store::ChargeOutcome;

#[derive(Clone, Debug)]
pub struct PgReceipts {
    pool: PgPool,
    writer: GroupWriter,
}

impl PgReceipts {
    /// Starts the store's writer task; it ends when the last clone of the store is dropped.
    pub fn new(pool: PgPool) -> Self {
        PgReceipts {
            writer: GroupWriter::start(
                PgGroups {
                    pool: pool.clone(),
                    conn: None,
                },
                pool.close_event(),
            ),
            pool,
        }
    }
}

/// One statement for a group of any size, so that it is prepared once per connection.
const INSERT: &str = "\
    INSERT INTO receipts (id, order_id, amount_minor, currency, operation_key, created_at) \
    SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::int8[], $4::text[], $5::text[], $6::timestamptz[]) \
    ON CONFLICT (order_id) DO NOTHING \
    RETURNING id, order_id, amount_minor, currency, operation_key, created_at";

const SELECT: &str = "\
    SELECT id, order_id, amount_minor, currency, operation_key, created_at \
    FROM receipts WHERE order_id = $1";

impl ReceiptStore for PgReceipts {
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

/// The writer's side of the store. It keeps the connection its last group went out on:
/// taking one from the pool for every group had the pool open new ones as load rose, and
/// opening one with TLS takes sqlx about 90 ms here (2–4 ms without; sqlx 0.9 leaves
/// Nagle on), a stall that every checkout of the group waited out.
struct PgGroups {
    pool: PgPool,
    conn: Option<PoolConnection<Postgres>>,
}

impl InsertGroup for PgGroups {
    async fn insert(&mut self, rows: &[Row]) -> Result<Vec<Receipt>, StoreError> {
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            // Taken apart from the statement so that a failure here is known not to charge.
            None => self.pool.acquire().await.map_err(StoreError::unreachable)?,
        };
        let inserted = sqlx::query(INSERT)
            .bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.order_id.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.amount.minor()).collect::<Vec<_>>())
            .bind(
                rows.iter()
                    .map(|r| r.amount.currency().code())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|r| r.operation_key.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|r| r.created_at).collect::<Vec<_>>())
            .fetch_all(&mut *conn)
            .await?;
        // Kept only after a success: a connection that failed a statement is let go.
        self.conn = Some(conn);
        inserted.iter().map(from_row).collect()
    }
}

fn from_row(row: &PgRow) -> Result<Receipt, StoreError> {
    receipt_from_columns(
        row.try_get::<Uuid, _>("id")?,
        row.try_get::<&str, _>("order_id")?,
        row.try_get::<i64, _>("amount_minor")?,
        row.try_get::<&str, _>("currency")?,
        row.try_get::<String, _>("operation_key")?,
        row.try_get::<DateTime<Utc>, _>("created_at")?,
    )
}
