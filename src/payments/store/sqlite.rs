use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::sqlite::{Sqlite, SqlitePool, SqliteRow};
use sqlx::{QueryBuilder, Row};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::{NewReceipt, Receipt, ReceiptStore, receipt_from_columns, settle};
use crate::db::StoreError;
use crate::payments::keys::{ChargeKey, OperationKey, OrderId};
use crate::payments::money::Money;
use crate::payments::store::ChargeOutcome;

/// Receipts in SQLite. Ids and times are stored as text (hyphenated UUID, RFC 3339 UTC
/// with microseconds), so that an operator's `sqlite3 checkout.db` shows what Postgres shows.
///
/// Charges are committed in groups by one writer task. A commit waits for the disk
/// (`synchronous=FULL`: an fsync), and SQLite commits one transaction at a time, so
/// commit by commit a burst of charges queues behind the disk. The writer takes every
/// charge that arrived while the last commit ran and inserts them as one multi-row
/// `INSERT … ON CONFLICT DO NOTHING RETURNING`: one fsync for the group. A lone charge is
/// written at once, and no caller hears of its charge before it is on disk.
#[derive(Clone, Debug)]
pub struct SqliteReceipts {
    pool: SqlitePool,
    writer: mpsc::Sender<Insert>,
}

/// A charge for the writer: its row, and who waits for the commit.
#[derive(Debug)]
struct Insert {
    id: Uuid,
    order_id: String,
    amount_minor: i64,
    currency: &'static str,
    operation_key: String,
    created_at: String,
    /// The receipt when this row was inserted; `None` when the order was charged before.
    done: oneshot::Sender<Result<Option<Receipt>, StoreError>>,
}

/// The most charges in one statement (SQLite takes up to 32,766 values; a row has six).
const MAX_GROUP: usize = 512;

impl SqliteReceipts {
    /// Starts the writer task; it ends when the last clone of this store is dropped.
    pub fn new(pool: SqlitePool) -> Self {
        let (writer, inserts) = mpsc::channel(MAX_GROUP);
        tokio::spawn(write_groups(pool.clone(), inserts));
        SqliteReceipts { pool, writer }
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
        let new = NewReceipt::now();
        let (done, committed) = oneshot::channel();
        let insert = Insert {
            id: new.id,
            order_id: key.order_id().as_str().to_owned(),
            amount_minor: amount.minor(),
            currency: amount.currency().code(),
            operation_key: operation.as_str().to_owned(),
            created_at: new.created_at.to_rfc3339_opts(SecondsFormat::Micros, true),
            done,
        };
        // Not queued: known not to charge. Queued but unanswered: it may have been written.
        self.writer
            .send(insert)
            .await
            .map_err(|_| StoreError::unreachable(sqlx::Error::PoolClosed))?;
        let inserted = committed
            .await
            .map_err(|_| StoreError::from(sqlx::Error::WorkerCrashed))??;
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

/// The writer: one statement, one commit, for every charge waiting.
async fn write_groups(pool: SqlitePool, mut inserts: mpsc::Receiver<Insert>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while inserts.recv_many(&mut group, MAX_GROUP).await > 0 {
        let mut written = insert_group(&pool, &group).await;
        for insert in group.drain(..) {
            let outcome = match &mut written {
                Ok(receipts) => Ok(receipts.remove(&insert.id)),
                Err(err) => Err(err.clone()),
            };
            // The caller may have gone (a timeout); its charge stands all the same.
            let _ = insert.done.send(outcome);
        }
    }
}

/// Inserts the group; returns the receipts it made, by id. Rows whose order was already
/// charged (before, or by an earlier row of the same group) are not among them.
async fn insert_group(
    pool: &SqlitePool,
    group: &[Insert],
) -> Result<HashMap<Uuid, Receipt>, StoreError> {
    // Taken apart from the statement so that a failure here is known not to charge.
    let mut conn = pool.acquire().await.map_err(StoreError::unreachable)?;
    let mut statement = QueryBuilder::<Sqlite>::new(INSERT);
    statement.push_values(group, |mut row, insert| {
        row.push_bind(insert.id.to_string())
            .push_bind(insert.order_id.clone())
            .push_bind(insert.amount_minor)
            .push_bind(insert.currency)
            .push_bind(insert.operation_key.clone())
            .push_bind(insert.created_at.clone());
    });
    statement.push(ON_CONFLICT);
    let rows = statement.build().fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|row| from_row(row).map(|receipt| (receipt.id, receipt)))
        .collect()
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
