//! Group commit: the charges that arrive together are written by one statement, in one
//! commit.
//!
//! Each charge is a row of an `INSERT … ON CONFLICT (order_id) DO NOTHING RETURNING`.
//! Written one by one, every charge is also a commit of its own, and a commit waits for
//! the disk. One writer task per store takes every charge queued while the last group
//! was being written and inserts them together: one statement, one round trip, one
//! commit for the group. A lone charge is written at once, and no caller hears of its
//! charge before the commit. The database still settles every race: a row whose order
//! is charged already (before, by another instance, or by an earlier row of the same
//! group) is skipped, and its caller reads the winner.

use std::collections::HashMap;

use chrono::{SubsecRound, Utc};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::receipts::{self, NewReceipt, Receipt};
use crate::db::{Database, Pooled, StoreError};
use crate::payments::keys::{ChargeKey, OperationKey};
use crate::payments::money::Money;

/// The most charges in one statement (SQLite takes up to 32,766 values; a row has six).
const MAX_GROUP: usize = 512;

#[derive(Debug)]
struct Pending {
    row: NewReceipt,
    /// The receipt when this row was inserted; `None` when its order was charged before.
    done: oneshot::Sender<Result<Option<Receipt>, StoreError>>,
}

/// The queue in front of a store's writer task; the task ends with the last clone.
#[derive(Clone, Debug)]
pub struct GroupWriter {
    queue: mpsc::Sender<Pending>,
}

impl GroupWriter {
    /// Starts the writer task. It ends when the last clone of the writer is dropped, or
    /// when the database is being closed: it then lets go of the connection it keeps,
    /// which the pool's `close` would wait for.
    pub fn start(db: &Database) -> GroupWriter {
        let (queue, pending) = mpsc::channel(MAX_GROUP);
        let writer = Writer {
            db: db.clone(),
            kept: None,
        };
        tokio::spawn(write_groups(writer, pending, db.close_event()));
        GroupWriter { queue }
    }

    /// Inserts the key's order's row with the next group: its receipt once committed, or
    /// `None` when the order had been charged.
    pub async fn insert(
        &self,
        key: &ChargeKey,
        amount: Money,
        operation: &OperationKey,
    ) -> Result<Option<Receipt>, StoreError> {
        let (done, committed) = oneshot::channel();
        let row = NewReceipt {
            id: Uuid::now_v7(),
            order_id: key.order_id().as_str().to_owned(),
            amount,
            operation_key: operation.as_str().to_owned(),
            created_at: Utc::now().trunc_subsecs(6),
        };
        // Not queued: known not to charge. Queued but unanswered: it may have been written.
        self.queue
            .send(Pending { row, done })
            .await
            .map_err(|_| StoreError::unreachable(sqlx::Error::PoolClosed))?;
        committed
            .await
            .map_err(|_| StoreError::from(sqlx::Error::WorkerCrashed))?
    }
}

/// The writer's side: a group is one statement on one connection, which it keeps when
/// the pool has others to spare. Taking one from the pool for every group had the pool
/// open new ones as load rose, and opening one with TLS takes sqlx about 90 ms here (2–4 ms
/// without; sqlx 0.9 leaves Nagle on), a stall that every checkout of the group waited out.
/// SQLite's pool has one connection, which the reads need between groups.
struct Writer {
    db: Database,
    kept: Option<Pooled>,
}

impl Writer {
    /// Inserts `rows` in one statement, committed on its own; the receipts it made.
    ///
    /// One round trip a group: an explicit transaction (BEGIN, the insert, COMMIT) would
    /// cost two more on Postgres, and would turn "the charge committed, its answer lost"
    /// (`tests/db_restart.rs`) into "BEGIN's answer lost, nothing charged". Rows of another
    /// table that must commit with a receipt join it here: on Postgres as a
    /// data-modifying CTE of this one statement, or by wrapping it in a transaction.
    async fn write(&mut self, rows: &[NewReceipt]) -> Result<Vec<Receipt>, StoreError> {
        let mut conn = match self.kept.take() {
            Some(conn) => conn,
            None => self.db.acquire().await?,
        };
        let inserted = receipts::insert(conn.conn(), rows).await?;
        // Kept only after a success: a connection that failed a statement is let go.
        if self.db.max_connections() > 1 {
            self.kept = Some(conn);
        }
        Ok(inserted)
    }
}

async fn write_groups(
    mut writer: Writer,
    mut pending: mpsc::Receiver<Pending>,
    closing: impl Future<Output = ()>,
) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    tokio::pin!(closing);
    loop {
        tokio::select! {
            received = pending.recv_many(&mut group, MAX_GROUP) => if received == 0 { return },
            () = &mut closing => return,
        }
        // One order for every group of every instance: two groups racing for the same
        // orders on one Postgres wait for each other in that order, and cannot deadlock.
        group.sort_by(|a, b| a.row.order_id.cmp(&b.row.order_id));
        let (rows, mut waiting): (Vec<NewReceipt>, Vec<_>) =
            group.drain(..).map(|p| (p.row, p.done)).unzip();
        // A write is bounded by its callers' patience, as a statement of their own would
        // be: when every one of them has given up (their loop timed out), so does the
        // write, and a statement whose answer never comes cannot stall the charges after it.
        let everyone_gone = async {
            for done in &mut waiting {
                done.closed().await;
            }
        };
        let mut written = tokio::select! {
            written = writer.write(&rows) => written.map(|receipts| {
                receipts.into_iter().map(|r| (r.id, r)).collect::<HashMap<Uuid, Receipt>>()
            }),
            () = everyone_gone => continue,
        };
        for (row, done) in rows.iter().zip(waiting) {
            let outcome = match &mut written {
                Ok(receipts) => Ok(receipts.remove(&row.id)),
                Err(err) => Err(err.clone()),
            };
            // The caller may have gone (a timeout); its charge stands all the same.
            let _ = done.send(outcome);
        }
    }
}
