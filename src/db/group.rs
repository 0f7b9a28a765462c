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
//! its own, on a connection of its own: at 64 keyed checkouts in flight, 0.39 statements
//! a checkout, each some 125 µs of Postgres's CPU and as much of the service's beyond
//! what its rows cost (issue 34).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use std::future::poll_fn;
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot};

use super::batch::{Batch, PgBatch, Returned};
use super::{Database, Pooled, SqliteFile, StoreError, on_conn};

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
/// thread for the connection, each side waking the other and waiting for a core (issue
/// 34: at 64 keyed checkouts in flight, the writer's task waited some 0.65 ms a
/// transaction for a worker), and readers waited for the writer's transactions.
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

async fn write_sqlite(
    file: Arc<SqliteFile>,
    added: mpsc::UnboundedReceiver<Box<dyn Lane>>,
    closing: impl Future<Output = ()>,
) {
    let mut lanes = Lanes::new(added);
    // The writer's own connection, opened at its first transaction, and again after one
    // that left it in a state nobody knows. Its statements stay prepared for its life.
    let mut conn: Option<rusqlite::Connection> = None;
    tokio::pin!(closing);
    while let Some(tables) = lanes.ready(closing.as_mut()).await {
        let (batch, groups) = transaction(tables);
        let mut committed = match conn.take().map_or_else(|| file.open(), Ok) {
            Ok(open) => {
                let (committed, usable) = commit(&open, batch);
                if usable {
                    conn = Some(open);
                }
                committed
            }
            Err(err) => Err(StoreError::sqlite(err)),
        };
        for group in groups {
            group.finish(committed.as_mut().map_err(|err| &*err));
        }
    }
}

/// Postgres's writer: each time a table has rows, one statement for what every table
/// took, on a connection it keeps. One at a time: with two in flight (rows that came
/// while one was being written went in the next at once, on a second connection), each
/// statement held half the rows, and at 64 keyed checkouts in flight Postgres spent 182
/// µs of CPU a checkout where one at a time spent 93-106 (issue 34).
async fn write_postgres(
    db: Database,
    added: mpsc::UnboundedReceiver<Box<dyn Lane>>,
    closing: impl Future<Output = ()>,
) {
    let mut lanes = Lanes::new(added);
    let mut conn = PgWriterConn {
        db,
        kept: None,
        texts: HashMap::new(),
        suspect: false,
    };
    tokio::pin!(closing);
    while let Some(tables) = lanes.ready(closing.as_mut()).await {
        let mut batch = PgBatch::default();
        let groups: Vec<_> = tables
            .iter_mut()
            .filter(|t| t.taken())
            .map(|t| t.push_pg(&mut batch))
            .collect();
        write_statement(&mut conn, batch, groups).await;
    }
}

/// Runs `batch` on `conn` and answers its `groups`. A statement is bounded by its
/// callers' patience, as a statement of their own would be: when every one of them has
/// given up (their loop timed out), so does the writer, and a statement whose answer
/// never comes cannot stall the rows after it.
async fn write_statement(
    conn: &mut PgWriterConn,
    batch: PgBatch,
    mut groups: Vec<Box<dyn Pushed>>,
) {
    let committed = {
        let write = conn.write(batch);
        let everyone_gone = poll_fn(|cx| {
            let mut gone = Poll::Ready(());
            for group in groups.iter_mut() {
                if group.poll_gone(cx).is_pending() {
                    gone = Poll::Pending;
                }
            }
            gone
        });
        tokio::select! {
            committed = write => Some(committed),
            () = everyone_gone => None,
        }
    };
    if let Some(mut committed) = committed {
        for group in groups {
            group.finish(committed.as_mut().map_err(|err| &*err));
        }
    }
}

/// A group's statement finds its rows by key: each row of the group one probe of the
/// table's primary key. Postgres plans a prepared statement once per connection and keeps
/// that plan until the table is next analyzed; planned while the table was small (a new
/// database, the first seconds under load), the plan scanned the whole table for every
/// row of the group, and kept doing so as the table grew: a saved answer's group took
/// 30-60 ms at 20,000 records (issue 34; autovacuum, which analyzes, may be off or
/// behind). With sequential scans off on the connection the writer keeps, the kept plan
/// probes by key whatever the table's size was when it was made (a pool of one
/// connection, which the writer does not keep, goes without). Planning every execution
/// afresh (`plan_cache_mode = force_custom_plan`) also mends it, at 60-100 µs of
/// Postgres's CPU a keyed checkout.
const BY_KEY: &str = "SET enable_seqscan = off";

/// The connection of Postgres's writer, which it keeps when the pool has others to spare.
/// Taking one from the pool for every statement had the pool open new ones as load rose,
/// and opening one with TLS took sqlx about 90 ms here (2–4 ms without; sqlx 0.9.0 left
/// Nagle on, vendor/README.md), a stall that every row of the statement waited out.
struct PgWriterConn {
    db: Database,
    kept: Option<Pooled>,
    /// Each statement's text, by its parts: built once.
    texts: HashMap<Vec<usize>, Arc<str>>,
    /// The last write failed: the next connection taken is tested first.
    suspect: bool,
}

impl PgWriterConn {
    async fn write(&mut self, batch: PgBatch) -> Result<Returned, StoreError> {
        let mut conn = match self.kept.take() {
            Some(conn) => conn,
            None => {
                // Boxed, as the statement is: taking a connection is a future of some
                // kilobytes, which every statement's future would otherwise carry.
                let taken = Box::pin(self.take()).await;
                self.suspect = taken.is_err();
                taken?
            }
        };
        let Pooled::Postgres(c) = &mut conn else {
            unreachable!("only Postgres's writer runs a statement of parts");
        };
        let text = self
            .texts
            .entry(batch.key())
            .or_insert_with(|| batch.text().into())
            .clone();
        // Kept only after a success: a connection that failed a statement is let go. The
        // statement's future is boxed: some kilobytes, moved into each future around it
        // unboxed (a lone keyed checkout copied some 45 KB, callgrind).
        let written = Box::pin(batch.run_text(c, text)).await;
        self.suspect = written.is_err();
        let written = written?;
        if self.keeps() {
            self.kept = Some(conn);
        }
        Ok(written)
    }

    /// A connection from the pool; after a failed write, one that answers a ping. A
    /// failure that was the database restarting leaves every idle connection of the pool
    /// dead, and without the ping each would fail a statement of its own (as many as the
    /// pool kept connections, where the loop retry has three attempts). The pool closes a
    /// connection whose ping failed when it is dropped.
    async fn take(&mut self) -> Result<Pooled, StoreError> {
        let mut conn = self.take_alive().await?;
        if let (true, Pooled::Postgres(c)) = (self.keeps(), &mut conn) {
            // The setting is this writer's: when it lets go of the connection (a failed
            // write, the end), the connection is closed, not handed to other statements.
            c.close_on_drop();
            sqlx::query(BY_KEY).execute(&mut **c).await?;
        }
        Ok(conn)
    }

    /// Whether the writer keeps its connection between statements: when the pool has
    /// others to spare.
    fn keeps(&self) -> bool {
        self.db.max_connections() > 1
    }

    async fn take_alive(&mut self) -> Result<Pooled, StoreError> {
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

/// The transaction that writes what the tables took, and their groups in it: each table's
/// statements, taking the write lock at once (waiting within the busy timeout for a
/// transaction of the pool's connection), so that no statement of it meets another writer.
fn transaction(tables: &mut [Box<dyn Lane>]) -> (Batch, Vec<Box<dyn Pushed>>) {
    let mut batch = Batch::default();
    batch.push("BEGIN IMMEDIATE");
    let groups = tables
        .iter_mut()
        .filter(|t| t.taken())
        .map(|t| t.push(&mut batch))
        .collect();
    batch.push("COMMIT");
    (batch, groups)
}

/// Runs the `transaction` on `conn`; what its statements returned, past its `BEGIN`, and
/// whether `conn` is fit for the next. The first failure rolls back all of them.
fn commit(conn: &rusqlite::Connection, transaction: Batch) -> (Result<Returned, StoreError>, bool) {
    match transaction.run(conn) {
        Ok(mut returned) => {
            returned.skip();
            (Ok(returned), true)
        }
        Err(err) => {
            // The batch stopped at the statement that failed: inside the transaction, or
            // at a `COMMIT` that failed and left it open. No transaction open (`BEGIN`
            // failed, or SQLite rolled back a failed `COMMIT` itself): nothing to undo.
            // Should the rollback fail, the connection is closed rather than used on in
            // a state nobody knows.
            let usable = conn.is_autocommit() || conn.execute_batch("ROLLBACK").is_ok();
            (Err(err), usable)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::db::{BeginWrite, PgPart, PoolSettings};

    /// A table of this test's own, whose group is two statements: a row goes into `kept`
    /// and then into `checked`, which refuses `"boom"` (a fault the service's tables
    /// cannot be made to raise: every value they take comes from typed Rust).
    /// On Postgres its part is the one it is made with: [`TWO_STATEMENTS`] writes as the
    /// SQLite statements do; [`OTHER`] writes a row into `other`.
    struct TwoStatements(PgPart);

    const TWO_STATEMENTS: PgPart = PgPart::new(
        "kept_rows AS (INSERT INTO kept (v) SELECT * FROM UNNEST($1::text[]) RETURNING v), \
         checked_rows AS (INSERT INTO checked (v) SELECT * FROM UNNEST($1::text[]))",
        "json_build_array(v)::text FROM kept_rows",
        false,
    );

    const OTHER: PgPart = PgPart::new(
        "other_rows AS (INSERT INTO other (v) SELECT * FROM UNNEST($1::text[]) RETURNING v)",
        "json_build_array(v)::text FROM other_rows",
        false,
    );

    impl GroupWrite for TwoStatements {
        type Row = &'static str;
        type Out = ();

        fn order(a: &Self::Row, b: &Self::Row) -> Ordering {
            a.cmp(b)
        }

        fn push_pg(&self, batch: &mut PgBatch, rows: &[Self::Row]) {
            batch.part(self.0, |b| {
                b.bind(rows.to_vec());
            });
        }

        fn read_pg(
            &self,
            rows: &[Self::Row],
            returned: &mut Returned,
        ) -> Result<Vec<()>, StoreError> {
            assert_eq!(returned.rows::<(String,)>()?.len(), rows.len());
            Ok(vec![(); rows.len()])
        }

        fn push(&self, batch: &mut Batch, rows: &[Self::Row]) {
            let rows: Vec<(&str,)> = rows.iter().map(|r| (*r,)).collect();
            batch.push_rows(
                "INSERT INTO kept (v) SELECT value ->> 0 FROM jsonb_each(?)",
                &rows,
            );
            batch.push_rows(
                "INSERT INTO checked (v) SELECT value ->> 0 FROM jsonb_each(?)",
                &rows,
            );
        }

        fn read(&self, rows: &[Self::Row], returned: &mut Returned) -> Result<Vec<()>, StoreError> {
            returned.skip();
            returned.skip();
            Ok(vec![(); rows.len()])
        }
    }

    /// A transaction of the pool's connection that reads before it writes commits while
    /// SQLite's writer commits on its own connection: it takes the write lock at once
    /// (`BeginWrite`), where a deferred one that had read could not write once the writer
    /// had committed in between (`SQLITE_BUSY_SNAPSHOT`, which no busy timeout waits out).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pools_transactions_write_beside_the_sqlite_writer() {
        let (_dir, db) = sqlite_with(
            "CREATE TABLE kept (v TEXT NOT NULL); CREATE TABLE checked (v TEXT NOT NULL); \
             CREATE TABLE counted (n INTEGER NOT NULL);",
        )
        .await;
        let writer = GroupWriter::start(&db, TwoStatements(TWO_STATEMENTS));
        let writers: Vec<_> = (0..8)
            .map(|_| {
                let writer = writer.clone();
                tokio::spawn(async move {
                    for _ in 0..50 {
                        writer.write("row").await.unwrap();
                    }
                })
            })
            .collect();
        for _ in 0..40 {
            let mut conn = db.acquire().await.unwrap();
            let Pooled::Sqlite(c) = &mut conn else {
                unreachable!()
            };
            let mut tx = c.begin_write().await.unwrap();
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM kept")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            // The writer commits meanwhile, unless this transaction holds the lock.
            tokio::time::sleep(Duration::from_millis(2)).await;
            sqlx::query("INSERT INTO counted (n) VALUES (?)")
                .bind(n)
                .execute(&mut *tx)
                .await
                .expect("the pool's transaction writes after it read");
            tx.commit().await.unwrap();
        }
        for task in writers {
            task.await.unwrap();
        }
        assert_eq!(count(&db, "counted").await, 40);
        assert_eq!(count(&db, "kept").await, 400, "every row of the writer");
        assert_eq!(count(&db, "checked").await, 400);
    }

    /// SQLite's writer opens the file on a connection of its own, so a database only in
    /// the pool's memory is refused at start-up, and says why.
    #[tokio::test]
    async fn an_in_memory_sqlite_database_is_refused_at_start_up() {
        for url in ["sqlite::memory:", "sqlite://t.db?mode=memory"] {
            let refused = Database::open(url, &POOL).await.unwrap_err();
            assert!(
                matches!(refused, crate::db::OpenError::InMemory(_)),
                "{url}: {refused}"
            );
        }
    }

    const POOL: PoolSettings = PoolSettings {
        max_connections: 1,
        acquire_timeout: Duration::from_secs(5),
    };

    /// A SQLite database of its own in a new directory (kept while the test holds it),
    /// with the tables `schema` makes.
    async fn sqlite_with(schema: &'static str) -> (tempfile::TempDir, Database) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let db = Database::open(&url, &POOL).await.unwrap();
        let mut conn = db.acquire().await.unwrap();
        let Pooled::Sqlite(c) = &mut conn else {
            unreachable!()
        };
        sqlx::raw_sql(schema).execute(&mut **c).await.unwrap();
        drop(conn);
        (dir, db)
    }

    async fn count(db: &Database, table: &str) -> i64 {
        scalar(db, format!("SELECT count(*) FROM {table}")).await
    }

    async fn scalar(db: &Database, sql: String) -> i64 {
        let mut conn = db.acquire().await.unwrap();
        on_conn!(conn.conn(), c => sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_one(c).await.unwrap())
    }

    /// A statement that fails in SQLite's transaction rolls back the statements before it
    /// (of every table in it), every caller hears of it, and the next transaction commits
    /// on the same writer: the failed one was not left open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_sqlite_transaction_is_rolled_back_whole_and_the_writer_goes_on() {
        let (_dir, db) = sqlite_with(
            "CREATE TABLE kept (v TEXT NOT NULL); \
             CREATE TABLE checked (v TEXT NOT NULL CHECK (v <> 'boom'));",
        )
        .await;
        let writer = GroupWriter::start(&db, TwoStatements(TWO_STATEMENTS));
        let write = |row: &'static str| {
            let writer = writer.clone();
            tokio::spawn(async move { writer.write(row).await })
        };
        // The writer takes the first row and waits for SQLite's write lock, held here by a
        // transaction of the pool's connection, while the next three are queued: they are
        // the next transaction, together.
        let mut held = db.acquire().await.unwrap();
        let Pooled::Sqlite(c) = &mut held else {
            unreachable!()
        };
        let lock = c.begin_write().await.unwrap();
        let first = write("first");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let writes: Vec<_> = ["a", "boom", "c"].into_iter().map(write).collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        lock.commit().await.unwrap();
        drop(held);
        first.await.unwrap().unwrap();
        let mut failed = 0;
        for write in writes {
            failed += usize::from(write.await.unwrap().is_err());
        }
        assert_eq!(
            failed, 3,
            "every caller of the failed transaction hears of it"
        );
        assert_eq!(
            count(&db, "kept").await,
            1,
            "its first statement is rolled back"
        );
        assert_eq!(count(&db, "checked").await, 1);

        writer.write("d").await.unwrap();
        assert_eq!(count(&db, "kept").await, 2, "the next transaction commits");
        assert_eq!(count(&db, "checked").await, 2);
    }

    /// A Postgres schema of its own (in `TEST_DATABASE_URL`'s database, as the spec's
    /// tests make theirs), with the tables `schema` makes; the service's pool on it.
    async fn postgres_with(schema: &'static str) -> Database {
        let admin = std::env::var("TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/checkout_test".into());
        let name = format!("g_{}", uuid::Uuid::new_v4().simple());
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
            .await
            .expect("the tests' Postgres (scripts/test makes its database)");
        let made = format!("CREATE SCHEMA {name}; SET search_path = {name}; {schema}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(made))
            .execute(&mut conn)
            .await
            .unwrap();
        let separator = if admin.contains('?') { '&' } else { '?' };
        let url = format!("{admin}{separator}options[search_path]={name}");
        let pool = PoolSettings {
            max_connections: 4,
            acquire_timeout: Duration::from_secs(5),
        };
        Database::open(&url, &pool).await.unwrap()
    }

    /// A Postgres schema with `kept`, `checked` (which refuses `"boom"`) and `other`, and
    /// the writers of [`TWO_STATEMENTS`] and of [`OTHER`].
    async fn two_tables() -> (
        Database,
        GroupWriter<TwoStatements>,
        GroupWriter<TwoStatements>,
    ) {
        let db = postgres_with(
            "CREATE TABLE kept (v TEXT NOT NULL); \
             CREATE TABLE checked (v TEXT NOT NULL CHECK (v <> 'boom')); \
             CREATE TABLE other (v TEXT NOT NULL);",
        )
        .await;
        let two = GroupWriter::start(&db, TwoStatements(TWO_STATEMENTS));
        let other = GroupWriter::start(&db, TwoStatements(OTHER));
        (db, two, other)
    }

    /// Writes `row` in a task of its own.
    fn spawn_write<W: GroupWrite<Row = &'static str, Out = ()>>(
        writer: &GroupWriter<W>,
        row: &'static str,
    ) -> tokio::task::JoinHandle<Result<(), StoreError>> {
        let writer = writer.clone();
        tokio::spawn(async move { writer.write(row).await })
    }

    /// A transaction of the pool's connection locks `kept`, and the writer's statement of
    /// a first row waits for it: what is queued meanwhile is the next statement, together.
    /// The connection, for [`release`]; the first row's write.
    async fn first_waits(
        db: &Database,
        two: &GroupWriter<TwoStatements>,
    ) -> (Pooled, tokio::task::JoinHandle<Result<(), StoreError>>) {
        let mut held = db.acquire().await.unwrap();
        let Pooled::Postgres(c) = &mut held else {
            unreachable!()
        };
        sqlx::raw_sql("BEGIN; LOCK TABLE kept IN EXCLUSIVE MODE")
            .execute(&mut **c)
            .await
            .unwrap();
        let first = spawn_write(two, "first");
        tokio::time::sleep(Duration::from_millis(100)).await;
        (held, first)
    }

    /// Ends [`first_waits`]'s transaction.
    async fn release(mut held: Pooled) {
        let Pooled::Postgres(c) = &mut held else {
            unreachable!()
        };
        sqlx::raw_sql("COMMIT").execute(&mut **c).await.unwrap();
    }

    /// The transactions that wrote the rows of `tables`, told apart by their `xmin`.
    async fn transactions(db: &Database, tables: &str) -> i64 {
        scalar(
            db,
            format!("SELECT count(DISTINCT xmin::text) FROM ({tables}) AS t"),
        )
        .await
    }

    /// Postgres's writer writes the groups of every table that are ready at one moment in
    /// one statement, so one commit: here, rows of two tables queued while the writer waits
    /// for a lock held elsewhere are written by one transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_groups_of_every_table_ready_together_are_one_postgres_statement() {
        let (db, two, other) = two_tables().await;
        // The writer's first statement waits for `kept`, while rows of both tables queue
        // behind it.
        let (held, first) = first_waits(&db, &two).await;
        let mut writes = Vec::new();
        for row in ["a", "b", "c"] {
            writes.push(spawn_write(&two, row));
            writes.push(spawn_write(&other, row));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        release(held).await;
        first.await.unwrap().unwrap();
        for write in writes {
            write.await.unwrap().unwrap();
        }
        let (rows, first_rows) = (
            "SELECT xmin FROM kept WHERE v <> 'first' UNION ALL SELECT xmin FROM checked \
             WHERE v <> 'first' UNION ALL SELECT xmin FROM other",
            "SELECT xmin FROM kept UNION ALL SELECT xmin FROM checked UNION ALL SELECT xmin FROM other",
        );
        assert_eq!(count(&db, "other").await, 3);
        assert_eq!(count(&db, "kept").await, 4);
        assert_eq!(
            transactions(&db, rows).await,
            1,
            "the six rows queued together are one commit"
        );
        assert_eq!(transactions(&db, first_rows).await, 2);
    }

    /// A part that fails fails Postgres's whole statement: nothing of any table in it is
    /// written, every caller hears of it, and the next statement commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_postgres_statement_writes_no_table_and_the_writer_goes_on() {
        let (db, two, other) = two_tables().await;
        let (held, first) = first_waits(&db, &two).await;
        let failing = spawn_write(&two, "boom");
        let beside = spawn_write(&other, "beside");
        tokio::time::sleep(Duration::from_millis(100)).await;
        release(held).await;
        first.await.unwrap().unwrap();
        assert!(
            failing.await.unwrap().is_err(),
            "the failing part's caller hears of it"
        );
        assert!(beside.await.unwrap().is_err(), "so does the other table's");
        assert_eq!(
            count(&db, "other").await,
            0,
            "nothing of the other table is written"
        );
        assert_eq!(count(&db, "kept").await, 1, "nor of the failing table's");
        other.write("after").await.unwrap();
        two.write("after").await.unwrap();
        assert_eq!(count(&db, "other").await, 1, "the next statement commits");
        assert_eq!(count(&db, "kept").await, 2);
    }
}
