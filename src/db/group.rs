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
//! journal entries that commit with them; journal entries; idempotency records), in each
//! dialect.
//!
//! On Postgres each table's group is one statement on a connection of its own, and the
//! groups of different tables commit side by side. On SQLite, which writes one transaction
//! at a time and whose every commit waits for the disk, the groups that are ready
//! at the same moment — a new key's claim, a charge, a saved answer, each from another
//! table's writer — go into one transaction ([`SqliteWriter`]): one commit and one flush
//! for all of them, where each had been a commit of its own, queued behind the others'.
//! That transaction is one [`Batch`], which the writer runs itself, on a thread and a
//! connection of its own ([`Batch::run`]).

use std::cmp::Ordering;
use std::sync::Arc;

use std::future::poll_fn;
use std::task::{Context, Poll};

use sqlx::PgConnection;
use tokio::sync::{mpsc, oneshot};

use super::batch::{Batch, Returned};
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

    /// Postgres: writes `rows` in one statement, which is its commit; what became of
    /// each, in the order of `rows`.
    fn write(
        &self,
        conn: &mut PgConnection,
        rows: &[Self::Row],
    ) -> impl Future<Output = Result<Vec<Self::Out>, StoreError>> + Send;

    /// SQLite: the statements that write `rows`, added to the batch of the transaction
    /// `SqliteWriter` commits with the other tables' groups of the moment: the same
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

/// The queue in front of a table's writer task; the task ends with the last clone.
pub struct GroupWriter<W: GroupWrite> {
    queue: mpsc::Sender<Pending<W>>,
    /// SQLite's: keeps the one writer of every table running while this table has writers.
    _sqlite: Option<SqliteWriter>,
}

impl<W: GroupWrite> Clone for GroupWriter<W> {
    fn clone(&self) -> Self {
        GroupWriter {
            queue: self.queue.clone(),
            _sqlite: self._sqlite.clone(),
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
    ///
    /// On SQLite the table's queue is one more of the tables that SQLite's one writer
    /// commits together (`SqliteWriter`).
    pub fn start(db: &Database, table: W) -> GroupWriter<W> {
        let (queue, pending) = mpsc::channel(MAX_GROUP);
        let table = Arc::new(table);
        if let Some(sqlite) = db.sqlite_writer() {
            sqlite.add(Table::lane(table, pending));
            return GroupWriter {
                queue,
                _sqlite: Some(sqlite),
            };
        }
        let writer = Writer {
            db: db.clone(),
            table,
            kept: None,
            suspect: false,
        };
        tokio::spawn(write_groups(writer, pending, db.close_event()));
        GroupWriter {
            queue,
            _sqlite: None,
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

/// A group's statement finds its rows by key: each row of the group one probe of the
/// table's primary key. Postgres plans a prepared statement once per connection and keeps
/// that plan until the table is next analyzed; planned while the table was small (a new
/// database, the first seconds under load), the plan scanned the whole table for every
/// row of the group, and kept doing so as the table grew: a saved answer's group took 30-
/// 60 ms at 20,000 records (issue 34; autovacuum, which analyzes, may be off or behind).
/// With sequential scans off on the connections the writers keep, the kept plan probes by
/// key whatever the table's size was when it was made (a pool of one connection, which
/// no writer keeps, goes without). Planning every execution afresh
/// (`plan_cache_mode = force_custom_plan`) also mends it, at 60-100 µs of Postgres's CPU
/// a keyed checkout.
const BY_KEY: &str = "SET enable_seqscan = off";

/// The writer's side on Postgres: a group is one statement on one connection, which it
/// keeps when the pool has others to spare. Taking one from the pool for every group had
/// the pool open new ones as load rose, and opening one with TLS took sqlx about 90 ms
/// here (2–4 ms without; sqlx 0.9.0 left Nagle on, vendor/README.md), a stall that every
/// row of the group waited out.
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
            None => {
                let taken = self.take().await;
                self.suspect = taken.is_err();
                taken?
            }
        };
        let Pooled::Postgres(c) = &mut conn else {
            unreachable!("only Postgres's tables have a writer of their own");
        };
        // Kept only after a success: a connection that failed a statement is let go.
        let written = self.table.write(c, rows).await;
        self.suspect = written.is_err();
        let written = written?;
        if self.keeps() {
            self.kept = Some(conn);
        }
        self.table.committed(rows);
        Ok(written)
    }

    /// A connection from the pool; after a failed write, one that answers a ping. A
    /// failure that was the database restarting leaves every idle connection of the pool
    /// dead, and without the ping each would fail a group of its own (as many groups as
    /// the pool kept connections, where the loop retry has three attempts). The pool
    /// closes a connection whose ping failed when it is dropped.
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

    /// Whether the writer keeps its connection between groups: when the pool has others
    /// to spare.
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
        answer(written, waiting);
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

/// SQLite's one writer. SQLite writes one transaction at a time, and each commit waits for
/// the disk: a group of each table committed apart, one after the other, each waiting
/// for the connection and then for its own flush. So one thread takes every table's queue
/// and writes what is queued in all of them in one transaction: one commit, one flush,
/// and no wait for the connection between them. A failure rolls back the transaction
/// and every group in it hears of it (nothing of theirs was written).
///
/// The thread runs the transaction on a connection of its own, with rusqlite: with sqlx's
/// calls on the pool's one connection, every statement (and then every transaction, as one
/// command) was a round trip between a task of the runtime and sqlx's thread for the
/// connection, each side waking the other and waiting for a core (issue 34: at 64 keyed
/// checkouts in flight, the writer's task waited some 0.65 ms a transaction for a worker),
/// and readers waited for the writer's transactions. Statements on the pool's connection
/// that write take the lock at once (`BEGIN IMMEDIATE`, `db::BeginWrite`) and wait for the
/// writer's transaction, as the writer's does for theirs.
///
/// Not bounded by the callers' patience as a Postgres group is: a statement on a local
/// file always answers (within the busy timeout).
#[derive(Clone, Debug)]
pub(super) struct SqliteWriter {
    tables: mpsc::UnboundedSender<Box<dyn Lane>>,
}

/// One table's queue, as SQLite's writer sees it.
pub(super) trait Lane: Send {
    /// Takes what is queued; ready with 0 when the table's writers are all gone.
    fn poll_take(&mut self, cx: &mut Context<'_>) -> Poll<usize>;
    fn taken(&self) -> bool;
    /// Adds the statements that write what was taken to the transaction's batch.
    fn push(&mut self, batch: &mut Batch);
    /// Answers each caller of what was pushed, once the transaction ended: from what its
    /// statements returned, or of the failure.
    fn finish(&mut self, committed: Result<&mut Returned, &StoreError>);
}

struct Table<W: GroupWrite> {
    table: Arc<W>,
    pending: mpsc::Receiver<Pending<W>>,
    /// Received, for the next transaction.
    taken: Vec<Pending<W>>,
    /// In the transaction: the rows and their callers.
    rows: Vec<W::Row>,
    answering: Vec<Answer<W::Out>>,
}

impl<W: GroupWrite> Table<W> {
    fn lane(table: Arc<W>, pending: mpsc::Receiver<Pending<W>>) -> Box<dyn Lane> {
        Box::new(Table {
            table,
            pending,
            taken: Vec::new(),
            rows: Vec::new(),
            answering: Vec::new(),
        })
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

    fn push(&mut self, batch: &mut Batch) {
        self.taken.sort_by(|a, b| W::order(&a.row, &b.row));
        (self.rows, self.answering) = self.taken.drain(..).map(|p| (p.row, p.done)).unzip();
        self.table.push(batch, &self.rows);
    }

    fn finish(&mut self, committed: Result<&mut Returned, &StoreError>) {
        let written = match committed {
            Ok(returned) => {
                self.table.committed(&self.rows);
                // Committed; should a row's outcome not be readable, its caller hears so.
                self.table.read(&self.rows, returned)
            }
            // Rolled back: every caller hears of the failure.
            Err(err) => Err(err.clone()),
        };
        answer(written, std::mem::take(&mut self.answering));
        self.rows.clear();
    }
}

impl SqliteWriter {
    /// Starts SQLite's writer. It ends when every table's writers are gone (the database
    /// keeps only a weak handle), or when the database is being closed.
    pub(super) fn start(db: &Database, file: Arc<SqliteFile>) -> SqliteWriter {
        let (tables, added) = mpsc::unbounded_channel();
        let closing = db.close_event();
        // A thread of its own, with its own connection: it blocks while SQLite runs a
        // transaction (`commit`), and nothing else waits for that connection.
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("a runtime for SQLite's writer")
                    .block_on(write_sqlite(file, added, closing))
            })
            .expect("a thread for SQLite's writer");
        SqliteWriter { tables }
    }

    pub(super) fn downgrade(&self) -> mpsc::WeakUnboundedSender<Box<dyn Lane>> {
        self.tables.downgrade()
    }

    pub(super) fn upgrade(weak: &mpsc::WeakUnboundedSender<Box<dyn Lane>>) -> Option<Self> {
        weak.upgrade().map(|tables| SqliteWriter { tables })
    }

    fn add(&self, table: Box<dyn Lane>) {
        // The writer ends only once every sender, this one among them, is gone.
        let _ = self.tables.send(table);
    }
}

async fn write_sqlite(
    file: Arc<SqliteFile>,
    mut added: mpsc::UnboundedReceiver<Box<dyn Lane>>,
    closing: impl Future<Output = ()>,
) {
    let mut tables: Vec<Box<dyn Lane>> = Vec::new();
    let mut adding = true;
    // The writer's own connection, opened at its first transaction, and again after one
    // that left it in a state nobody knows. Its statements stay prepared for its life.
    let mut conn: Option<rusqlite::Connection> = None;
    tokio::pin!(closing);
    loop {
        let go_on =
            poll_fn(|cx| poll_rows(cx, closing.as_mut(), &mut added, &mut adding, &mut tables))
                .await;
        if !go_on {
            return;
        }
        let mut written: Vec<&mut Box<dyn Lane>> =
            tables.iter_mut().filter(|t| t.taken()).collect();
        let batch = transaction(&mut written);
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
        for table in written {
            table.finish(committed.as_mut().map_err(|err| &*err));
        }
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

/// The transaction that writes what the tables took: each table's statements, taking the
/// write lock at once (waiting within the busy timeout for a transaction of the pool's
/// connection), so that no statement of it meets another writer.
fn transaction(tables: &mut [&mut Box<dyn Lane>]) -> Batch {
    let mut batch = Batch::default();
    batch.push("BEGIN IMMEDIATE");
    for table in tables.iter_mut() {
        table.push(&mut batch);
    }
    batch.push("COMMIT");
    batch
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
    use crate::db::{BeginWrite, PoolSettings};

    /// A table of this test's own, whose group is two statements: a row goes into `kept`
    /// and then into `checked`, which refuses `"boom"` (a fault the service's tables
    /// cannot be made to raise: every value they take comes from typed Rust).
    struct TwoStatements;

    impl GroupWrite for TwoStatements {
        type Row = &'static str;
        type Out = ();

        fn order(a: &Self::Row, b: &Self::Row) -> Ordering {
            a.cmp(b)
        }

        async fn write(
            &self,
            _: &mut PgConnection,
            _: &[Self::Row],
        ) -> Result<Vec<()>, StoreError> {
            unreachable!("a SQLite test")
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
        let writer = GroupWriter::start(&db, TwoStatements);
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
        let mut conn = db.acquire().await.unwrap();
        let sql = format!("SELECT count(*) FROM {table}");
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
        let writer = GroupWriter::start(&db, TwoStatements);
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
}
