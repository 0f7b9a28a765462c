//! Group commit: rows that arrive together are written by one statement, in one commit.
//!
//! Written one by one, every row is a commit of its own, and a commit waits for the disk.
//! One writer takes every row queued while the last group was being written and writes
//! them together: one round trip, one commit for the group. A lone row is written at
//! once, and no caller hears of its row before the commit. The database still settles
//! every race: the statements' own conflict clauses decide which rows go in, and each
//! caller hears what became of its row.
//!
//! What a group is written with is the table's: a [`GroupWrite`] (receipts, with the
//! journal entries that commit with them; journal entries; idempotency records), in each
//! dialect.
//!
//! One writer per database takes the groups of every table that are ready at the same
//! moment — a new key's claim, a charge, a saved answer — and commits them together: on
//! Postgres as one statement, each table's group a part of it ([`PgBatch`]); on SQLite,
//! which writes one transaction at a time and whose every commit waits for the disk, as
//! one transaction ([`Batch`]), which the writer runs itself, on a thread and a connection
//! of its own ([`Batch::run`]). On Postgres each table's group had been a statement of
//! its own, on a connection of its own, and a statement costs Postgres's CPU and the
//! service's far beyond what its rows cost (figure 13, docs/benchmark.md).

mod postgres;

/// The settings of Postgres's group writer's connection.
pub use postgres::BY_KEY as PG_WRITER_SETTINGS;
mod sqlite;
#[cfg(test)]
mod tests;

use std::cmp::Ordering;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot};

use super::batch::{Batch, PgBatch, Returned};
use super::{Database, SqliteFile, StoreError};
use postgres::write_postgres;
use sqlite::write_sqlite;

/// The most rows of a table in one group.
const MAX_GROUP: usize = 512;

/// How one table writes a group of rows.
pub trait GroupWrite: Send + Sync + 'static {
    type Row: Send + Sync + 'static;
    /// What the caller of one row hears once the group committed.
    type Out: Send + 'static;

    /// One order for every group of every instance: two groups racing for the same rows
    /// on one Postgres wait for each other in that order, and cannot deadlock.
    fn order(a: &Self::Row, b: &Self::Row) -> Ordering;

    /// Postgres: the part of the statement of the moment that writes `rows`
    /// ([`PgBatch::part`]): the same text whatever the rows.
    fn push_pg(&self, batch: &mut PgBatch, rows: &[Self::Row]);

    /// Postgres: what became of each row of `rows`, read from the rows its part returned.
    fn read_pg(
        &self,
        rows: &[Self::Row],
        returned: &mut Returned,
    ) -> Result<Vec<Self::Out>, StoreError>;

    /// SQLite: the statements that write `rows`, added to the batch of the transaction
    /// the writer commits with the other tables' groups of the moment: the same
    /// statements whatever the rows.
    fn push(&self, batch: &mut Batch, rows: &[Self::Row]);

    /// SQLite: what became of each row of `rows`, read from what the statements of
    /// [`push`](Self::push) returned.
    fn read(
        &self,
        rows: &[Self::Row],
        returned: &mut Returned,
    ) -> Result<Vec<Self::Out>, StoreError>;

    /// Told once `rows` committed (the streams that follow them may read them now).
    fn committed(&self, _rows: &[Self::Row]) {}
}

struct Pending<W: GroupWrite> {
    row: W::Row,
    done: Answer<W::Out>,
}

/// The queue in front of a table's lane of the database's writer.
pub struct GroupWriter<W: GroupWrite> {
    queue: mpsc::Sender<Pending<W>>,
    /// Keeps the database's one writer running while this table has writers.
    _writer: Writer,
}

impl<W: GroupWrite> Clone for GroupWriter<W> {
    fn clone(&self) -> Self {
        GroupWriter {
            queue: self.queue.clone(),
            _writer: self._writer.clone(),
        }
    }
}

impl<W: GroupWrite> std::fmt::Debug for GroupWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupWriter").finish_non_exhaustive()
    }
}

impl<W: GroupWrite> GroupWriter<W> {
    /// Adds the table's queue to the database's writer (started with the first table's),
    /// which writes it with the other tables' groups of the moment.
    pub fn start(db: &Database, table: W) -> GroupWriter<W> {
        let (queue, pending) = mpsc::channel(MAX_GROUP);
        let writer = db.writer();
        writer.add(Table::lane(Arc::new(table), pending));
        GroupWriter {
            queue,
            _writer: writer,
        }
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

/// Tells each caller what became of its row, or of the failure.
fn answer<O>(written: Result<Vec<O>, StoreError>, callers: Vec<Answer<O>>) {
    match written {
        Ok(outs) => {
            for (out, done) in outs.into_iter().zip(callers) {
                // The caller may have gone (a timeout); its row stands all the same.
                let _ = done.send(Ok(out));
            }
        }
        Err(err) => {
            for done in callers {
                let _ = done.send(Err(err.clone()));
            }
        }
    }
}

type Answer<O> = oneshot::Sender<Result<O, StoreError>>;

/// The database's one writer: every table's queue is a lane of it. Each time one has
/// rows, it takes what is queued in all of them and writes it in one commit (Postgres:
/// one statement; SQLite: one transaction); a failure fails every group in it, and each
/// of their callers hears of it (nothing of theirs was written).
///
/// On SQLite the writer is a thread with a connection of its own, with rusqlite: with
/// sqlx's calls on the pool's one connection, every statement (and then every
/// transaction, as one command) was a round trip between a task of the runtime and sqlx's
/// thread for the connection, each side waking the other and waiting for a core (at 64
/// keyed checkouts in flight the writer's task waited for a worker every transaction,
/// figure 13), and readers waited for the writer's transactions.
/// Statements on the pool's connection that write take the lock at once (`BEGIN
/// IMMEDIATE`, `db::BeginWrite`) and wait for the writer's transaction, as the writer's
/// does for theirs. On Postgres it is a task of the runtime, with a connection it keeps.
#[derive(Clone, Debug)]
pub(super) struct Writer {
    tables: mpsc::UnboundedSender<Box<dyn Lane>>,
}

/// One table's queue, as the writer sees it.
pub(super) trait Lane: Send {
    /// Takes what is queued; ready with 0 when the table's writers are all gone.
    fn poll_take(&mut self, cx: &mut Context<'_>) -> Poll<usize>;
    fn taken(&self) -> bool;
    /// Adds the statements that write what was taken to SQLite's transaction.
    fn push(&mut self, batch: &mut Batch) -> Box<dyn Pushed>;
    /// Adds the part that writes what was taken to Postgres's statement.
    fn push_pg(&mut self, batch: &mut PgBatch) -> Box<dyn Pushed>;
}

/// A table's group in a commit: its rows, and their callers to answer.
pub(super) trait Pushed: Send {
    /// Ready once every caller of the group has gone.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()>;
    /// Answers each caller once the commit ended: from what the group's statements
    /// returned, or of the failure.
    fn finish(self: Box<Self>, committed: Result<&mut Returned, &StoreError>);
}

struct Table<W: GroupWrite> {
    table: Arc<W>,
    pending: mpsc::Receiver<Pending<W>>,
    /// Received, for the next commit.
    taken: Vec<Pending<W>>,
}

struct Group<W: GroupWrite> {
    table: Arc<W>,
    rows: Vec<W::Row>,
    answering: Vec<Answer<W::Out>>,
    /// Pushed to Postgres's statement (read with `read_pg`), else to SQLite's transaction.
    postgres: bool,
}

impl<W: GroupWrite> Table<W> {
    fn lane(table: Arc<W>, pending: mpsc::Receiver<Pending<W>>) -> Box<dyn Lane> {
        Box::new(Table {
            table,
            pending,
            taken: Vec::new(),
        })
    }

    /// What was taken, as a group in the table's order.
    fn group(&mut self, postgres: bool) -> Group<W> {
        self.taken.sort_by(|a, b| W::order(&a.row, &b.row));
        let (rows, answering) = self.taken.drain(..).map(|p| (p.row, p.done)).unzip();
        Group {
            table: self.table.clone(),
            rows,
            answering,
            postgres,
        }
    }
}

impl<W: GroupWrite> Lane for Table<W> {
    fn poll_take(&mut self, cx: &mut Context<'_>) -> Poll<usize> {
        match MAX_GROUP - self.taken.len() {
            0 => Poll::Ready(self.taken.len()),
            room => self.pending.poll_recv_many(cx, &mut self.taken, room),
        }
    }

    fn taken(&self) -> bool {
        !self.taken.is_empty()
    }

    fn push(&mut self, batch: &mut Batch) -> Box<dyn Pushed> {
        let group = self.group(false);
        group.table.push(batch, &group.rows);
        Box::new(group)
    }

    fn push_pg(&mut self, batch: &mut PgBatch) -> Box<dyn Pushed> {
        let group = self.group(true);
        group.table.push_pg(batch, &group.rows);
        Box::new(group)
    }
}

impl<W: GroupWrite> Pushed for Group<W> {
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        for done in &mut self.answering {
            if done.poll_closed(cx).is_pending() {
                return Poll::Pending;
            }
        }
        Poll::Ready(())
    }

    fn finish(self: Box<Self>, committed: Result<&mut Returned, &StoreError>) {
        let written = match committed {
            Ok(returned) => {
                self.table.committed(&self.rows);
                // Committed; should a row's outcome not be readable, its caller hears so.
                match self.postgres {
                    true => self.table.read_pg(&self.rows, returned),
                    false => self.table.read(&self.rows, returned),
                }
            }
            // Rolled back: every caller hears of the failure.
            Err(err) => Err(err.clone()),
        };
        answer(written, self.answering);
    }
}

impl Writer {
    /// Starts the database's writer: SQLite's on a thread of its own, Postgres's as a
    /// task. It ends when every table's writers are gone (the database keeps only a weak
    /// handle), or when the database is being closed.
    pub(super) fn start(db: &Database, sqlite: Option<Arc<SqliteFile>>) -> Writer {
        let (tables, added) = mpsc::unbounded_channel();
        let closing = db.close_event();
        match sqlite {
            // A thread of its own, with its own connection: it blocks while SQLite runs a
            // transaction (`commit`), and nothing else waits for that connection.
            Some(file) => {
                std::thread::Builder::new()
                    .name("sqlite-writer".into())
                    .spawn(move || {
                        tokio::runtime::Builder::new_current_thread()
                            .build()
                            .expect("a runtime for SQLite's writer")
                            .block_on(write_sqlite(file, added, closing))
                    })
                    .expect("a thread for SQLite's writer");
            }
            None => {
                tokio::spawn(write_postgres(db.clone(), added, closing));
            }
        }
        Writer { tables }
    }

    pub(super) fn downgrade(&self) -> mpsc::WeakUnboundedSender<Box<dyn Lane>> {
        self.tables.downgrade()
    }

    pub(super) fn upgrade(weak: &mpsc::WeakUnboundedSender<Box<dyn Lane>>) -> Option<Self> {
        weak.upgrade().map(|tables| Writer { tables })
    }

    fn add(&self, table: Box<dyn Lane>) {
        // The writer ends only once every sender, this one among them, is gone.
        let _ = self.tables.send(table);
    }
}
/// The tables' lanes, as the writer waits for rows in them.
struct Lanes {
    added: mpsc::UnboundedReceiver<Box<dyn Lane>>,
    adding: bool,
    tables: Vec<Box<dyn Lane>>,
}

impl Lanes {
    fn new(added: mpsc::UnboundedReceiver<Box<dyn Lane>>) -> Lanes {
        Lanes {
            added,
            adding: true,
            tables: Vec::new(),
        }
    }

    /// Once some table has rows, the tables; `None` when the writer is to end.
    async fn ready(
        &mut self,
        mut closing: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Option<&mut [Box<dyn Lane>]> {
        let Lanes {
            added,
            adding,
            tables,
        } = self;
        let go_on = poll_fn(|cx| poll_rows(cx, closing.as_mut(), added, adding, tables)).await;
        go_on.then_some(tables.as_mut_slice())
    }
}

/// Until some table has rows (ready with true), new tables join and tables whose writers
/// are gone leave; ready with false when the writer is to end.
fn poll_rows(
    cx: &mut Context<'_>,
    closing: std::pin::Pin<&mut impl Future<Output = ()>>,
    added: &mut mpsc::UnboundedReceiver<Box<dyn Lane>>,
    adding: &mut bool,
    tables: &mut Vec<Box<dyn Lane>>,
) -> Poll<bool> {
    if closing.poll(cx).is_ready() {
        return Poll::Ready(false);
    }
    while *adding {
        match added.poll_recv(cx) {
            Poll::Ready(Some(table)) => tables.push(table),
            Poll::Ready(None) => *adding = false,
            Poll::Pending => break,
        }
    }
    let mut ready = false;
    tables.retain_mut(|table| match table.poll_take(cx) {
        // Its writers are gone: it leaves once what it took is written.
        Poll::Ready(0) => {
            ready |= table.taken();
            table.taken()
        }
        Poll::Ready(_) => {
            ready = true;
            true
        }
        Poll::Pending => {
            ready |= table.taken();
            true
        }
    });
    match (ready, *adding || !tables.is_empty()) {
        (true, _) => Poll::Ready(true),
        (false, true) => Poll::Pending,
        (false, false) => Poll::Ready(false),
    }
}
