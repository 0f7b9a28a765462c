use std::time::Duration;

use super::*;
use crate::db::{BeginWrite, PgPart, PoolSettings, Pooled, on_conn};

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

    fn read_pg(&self, rows: &[Self::Row], returned: &mut Returned) -> Result<Vec<()>, StoreError> {
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
