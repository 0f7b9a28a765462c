//! Group commit: rows that arrive together are written by one statement, in one commit.
//!
//! Written one by one, every row is a commit of its own, and a commit waits for the disk.
//! One writer task per table takes every row queued while the last group was being
//! written and writes them together: one statement, one round trip, one commit for the
//! group. A lone row is written at once, and no caller hears of its row before the
//! commit. The database still settles every race: the statement's own conflict clauses
//! decide which rows go in, and each caller hears what became of its row.
//!
//! What a group is written with is the table's: a [`GroupWrite`] (receipts, with the
//! journal entries that commit with them; journal entries).

use std::cmp::Ordering;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{Conn, Database, Pooled, StoreError, on_conn};

/// The most rows in one statement (SQLite takes up to 32,766 values; a row has a dozen).
const MAX_GROUP: usize = 512;

/// How one table writes a group of rows.
pub trait GroupWrite: Send + Sync + 'static {
    type Row: Send + Sync + 'static;
    /// What the caller of one row hears once the group committed.
    type Out: Send + 'static;

    /// One order for every group of every instance: two groups racing for the same rows
    /// on one Postgres wait for each other in that order, and cannot deadlock.
    fn order(a: &Self::Row, b: &Self::Row) -> Ordering;

    /// Writes `rows` in one commit; what became of each, in the order of `rows`.
    fn write(
        &self,
        conn: Conn<'_>,
        rows: &[Self::Row],
    ) -> impl Future<Output = Result<Vec<Self::Out>, StoreError>> + Send;
}

struct Pending<W: GroupWrite> {
    row: W::Row,
    done: oneshot::Sender<Result<W::Out, StoreError>>,
}

/// The queue in front of a table's writer task; the task ends with the last clone.
pub struct GroupWriter<W: GroupWrite> {
    queue: mpsc::Sender<Pending<W>>,
}

impl<W: GroupWrite> Clone for GroupWriter<W> {
    fn clone(&self) -> Self {
        GroupWriter {
            queue: self.queue.clone(),
        }
    }
}

impl<W: GroupWrite> std::fmt::Debug for GroupWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupWriter").finish_non_exhaustive()
    }
}

impl<W: GroupWrite> GroupWriter<W> {
    /// Starts the writer task. It ends when the last clone of the writer is dropped, or
    /// when the database is being closed: it then lets go of the connection it keeps,
    /// which the pool's `close` would wait for.
    pub fn start(db: &Database, table: W) -> GroupWriter<W> {
        let (queue, pending) = mpsc::channel(MAX_GROUP);
        let writer = Writer {
            db: db.clone(),
            table: Arc::new(table),
            kept: None,
            suspect: false,
        };
        tokio::spawn(write_groups(writer, pending, db.close_event()));
        GroupWriter { queue }
    }

    /// Writes `row` with the next group; what became of it, once committed.
    pub async fn write(&self, row: W::Row) -> Result<W::Out, StoreError> {
        let (done, committed) = oneshot::channel();
        // Not queued: known not to be written. Queued but unanswered: it may have been.
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
/// open new ones as load rose, and opening one with TLS took sqlx about 90 ms here (2–4 ms
/// without; sqlx 0.9.0 left Nagle on, vendor/README.md), a stall that every row of the
/// group waited out.
/// SQLite's pool has one connection, which the reads need between groups.
struct Writer<W> {
    db: Database,
    table: Arc<W>,
    kept: Option<Pooled>,
    /// The last write failed: the next connection taken is tested first.
    suspect: bool,
}

impl<W: GroupWrite> Writer<W> {
    async fn write(&mut self, rows: &[W::Row]) -> Result<Vec<W::Out>, StoreError> {
        let mut conn = match self.kept.take() {
            Some(conn) => conn,
            None => self.take().await?,
        };
        // Kept only after a success: a connection that failed a statement is let go.
        let written = self.table.write(conn.conn(), rows).await;
        self.suspect = written.is_err();
        let written = written?;
        if self.db.max_connections() > 1 {
            self.kept = Some(conn);
        }
        Ok(written)
    }

    /// A connection from the pool; after a failed write, one that answers a ping. A
    /// failure that was the database restarting leaves every idle connection of the pool
    /// dead, and without the ping each would fail a group of its own (as many groups as
    /// the pool kept connections, where the loop retry has three attempts). The pool
    /// closes a connection whose ping failed when it is dropped.
    async fn take(&mut self) -> Result<Pooled, StoreError> {
        if self.suspect {
            for _ in 0..self.db.max_connections() {
                let mut conn = self.db.acquire().await?;
                let alive = on_conn!(conn.conn(), c => sqlx::Connection::ping(c).await);
                if alive.is_ok() {
                    return Ok(conn);
                }
            }
        }
        self.db.acquire().await
    }
}

async fn write_groups<W: GroupWrite>(
    mut writer: Writer<W>,
    mut pending: mpsc::Receiver<Pending<W>>,
    closing: impl Future<Output = ()>,
) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    tokio::pin!(closing);
    loop {
        tokio::select! {
            received = pending.recv_many(&mut group, MAX_GROUP) => if received == 0 { return },
            () = &mut closing => return,
        }
        group.sort_by(|a, b| W::order(&a.row, &b.row));
        let (rows, mut waiting): (Vec<W::Row>, Vec<_>) =
            group.drain(..).map(|p| (p.row, p.done)).unzip();
        // A write is bounded by its callers' patience, as a statement of their own would
        // be: when every one of them has given up (their loop timed out), so does the
        // write, and a statement whose answer never comes cannot stall the rows after it.
        let everyone_gone = async {
            for done in &mut waiting {
                done.closed().await;
            }
        };
        let written = tokio::select! {
            written = writer.write(&rows) => written,
            () = everyone_gone => continue,
        };
        match written {
            Ok(outs) => {
                for (out, done) in outs.into_iter().zip(waiting) {
                    // The caller may have gone (a timeout); its row stands all the same.
                    let _ = done.send(Ok(out));
                }
            }
            Err(err) => {
                for done in waiting {
                    let _ = done.send(Err(err.clone()));
                }
            }
        }
    }
}
