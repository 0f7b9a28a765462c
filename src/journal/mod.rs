//! The `agent_journal` table: an operation's model answers and tool results, in order,
//! under (caller, operation key, step). The assistant reads it to resume a loop
//! where it stopped (`assistant::memory`); this module only stores rows.
//!
//! Rows are appended through a group writer (one statement, one commit for every row
//! that arrives together), and a charge's own row commits with its receipt
//! (`payments::store::receipts`). Only the holder of the operation's lease appends: a row
//! names the fence it holds, and a row whose fence is no longer the record's is not
//! written. Rows expire with the operation's Idempotency-Key record and are swept with it.

pub mod wake;

use std::cmp::Ordering;
use std::collections::HashSet;
use std::sync::Arc;

use crate::db::{
    Batch, Conn, Database, GroupWrite, GroupWriter, PgBatch, PgBinder, PgPart, Returned,
    StoreError, on_conn,
};
use wake::Wake;

/// Which journal, and the right to append to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalKey {
    pub caller: String,
    pub operation_key: String,
    /// The fence of the operation's Idempotency-Key lease; `None` for an operation
    /// without a key (its minted key is its own, and nobody else can reach it).
    pub fence: Option<i64>,
}

/// A row about to be appended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEntry {
    pub key: JournalKey,
    pub step: i64,
    pub kind: EntryKind,
    /// The tool's name; empty for an answer.
    pub name: String,
    pub call_id: Option<String>,
    pub body: String,
    pub pins: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    /// How long the row is kept (the Idempotency-Key time to live), in milliseconds.
    pub ttl_ms: i64,
}

impl NewEntry {
    /// The row as it reads back.
    pub fn into_entry(self) -> Entry {
        Entry {
            step: self.step,
            kind: self.kind.as_str().to_owned(),
            name: self.name,
            call_id: self.call_id,
            body: self.body,
            pins: self.pins,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Answer,
    Tool,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Answer => "answer",
            EntryKind::Tool => "tool",
        }
    }
}

/// A row as read back.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Entry {
    pub step: i64,
    pub kind: String,
    pub name: String,
    pub call_id: Option<String>,
    pub body: String,
    pub pins: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
}

/// The journal of the service's database, with the task that appends rows in groups.
#[derive(Clone, Debug)]
pub struct Journal {
    db: Database,
    writer: GroupWriter<Entries>,
}

impl Journal {
    /// `wake`: the streams to tell when entries commit.
    pub fn new(db: &Database, wake: &Arc<Wake>) -> Journal {
        Journal {
            db: db.clone(),
            writer: GroupWriter::start(db, Entries(wake.clone())),
        }
    }

    /// Appends `entries` (one operation's next steps) with the next group. False when
    /// not all were written: the lease is no longer theirs, or another writer has a step.
    pub async fn append(&self, entries: Vec<NewEntry>) -> Result<bool, StoreError> {
        if entries.is_empty() {
            return Ok(true);
        }
        self.writer.write(entries).await
    }

    /// The journal of an operation, step by step.
    pub async fn load(&self, caller: &str, operation_key: &str) -> Result<Vec<Entry>, StoreError> {
        read(&self.db, caller, operation_key).await
    }

    /// Deletes an operation's journal to start afresh; false when nothing was deleted
    /// (the lease is no longer ours, or there was nothing to delete).
    pub async fn discard(&self, key: &JournalKey) -> Result<bool, StoreError> {
        let mut conn = self.db.acquire().await?;
        let deleted = on_conn!(conn.conn(), c => sqlx::query(DISCARD)
            .bind(&key.caller)
            .bind(&key.operation_key)
            .bind(key.fence)
            .execute(c)
            .await?
            .rows_affected());
        Ok(deleted > 0)
    }
}

const LOAD: &str = "\
    SELECT step, kind, name, call_id, body, pins, input_tokens, output_tokens \
    FROM agent_journal WHERE scope = $1 AND operation_key = $2 ORDER BY step";

const DISCARD: &str = "\
    DELETE FROM agent_journal WHERE scope = $1 AND operation_key = $2 \
    AND (CAST($3 AS BIGINT) IS NULL OR EXISTS (SELECT 1 FROM idempotency_keys k \
    WHERE k.scope = $1 AND k.key = $2 AND k.fence = $3 AND k.status IS NULL))";

const FORGET: &str = "DELETE FROM agent_journal WHERE scope = $1 AND operation_key = $2";

const SWEEP: &str = "DELETE FROM agent_journal WHERE expires_at <= (SELECT now_ms FROM clock)";

pub const HOLD: &str = "\
    UPDATE agent_journal SET expires_at = CASE WHEN expires_at < $3 THEN $3 ELSE expires_at END \
    WHERE scope = $1 AND operation_key = $2";

/// The journal of an operation, step by step, read from `db` (a stream's reader: it
/// appends nothing, so it needs no writer).
pub async fn read(
    db: &Database,
    caller: &str,
    operation_key: &str,
) -> Result<Vec<Entry>, StoreError> {
    let mut conn = db.acquire().await?;
    Ok(on_conn!(conn.conn(), c => sqlx::query_as(LOAD)
        .bind(caller)
        .bind(operation_key)
        .fetch_all(c)
        .await?))
}

/// Deletes an operation's journal (its Idempotency-Key record is being forgotten).
pub async fn forget(conn: Conn<'_>, caller: &str, operation_key: &str) -> Result<(), StoreError> {
    on_conn!(conn, c => sqlx::query(FORGET).bind(caller).bind(operation_key).execute(c).await.map(drop)?);
    Ok(())
}

/// Keeps an operation's rows at least until `until_ms` (epoch ms): a paused operation's
/// journal outlives its approval.
pub async fn hold(
    conn: Conn<'_>,
    caller: &str,
    operation_key: &str,
    until_ms: i64,
) -> Result<(), StoreError> {
    on_conn!(conn, c => sqlx::query(HOLD)
        .bind(caller)
        .bind(operation_key)
        .bind(until_ms)
        .execute(c)
        .await
        .map(drop)?);
    Ok(())
}

/// Deletes expired rows; how many.
pub async fn sweep(conn: Conn<'_>) -> Result<u64, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query(SWEEP).execute(c).await?.rows_affected()))
}

/// The columns an insert names, in the order both dialects give the values.
macro_rules! columns {
    () => {
        "scope, operation_key, step, kind, name, call_id, body, pins, input_tokens, output_tokens, expires_at"
    };
}

/// A row goes in when it holds the lease: no fence (an operation without a key), or the
/// fence of an unfinished record. On Postgres the record is share-locked, so a takeover
/// waits for this insert's commit, or this insert sees the takeover and writes nothing.
macro_rules! holds_lease {
    ($lock:literal) => {
        concat!(
            "(e.fence IS NULL OR EXISTS (SELECT 1 FROM idempotency_keys k ",
            "WHERE k.scope = e.scope AND k.key = e.operation_key AND k.fence = e.fence ",
            "AND k.status IS NULL",
            $lock,
            "))"
        )
    };
}

/// An insert of rows given as Postgres arrays (one statement for a group of any size,
/// prepared once), the arrays being the 13 parameters named, in the order of
/// [`PgEntries::bind`], and written only where `$filter` holds.
macro_rules! pg_insert {
    ($p:literal, $filter:expr) => {
        concat!(
            "INSERT INTO agent_journal (",
            $crate::journal::columns!(),
            ") SELECT e.scope, e.operation_key, e.step, e.kind, e.name, e.call_id, e.body, e.pins, ",
            "e.input_tokens, e.output_tokens, clock.now_ms + e.ttl_ms FROM UNNEST(",
            $p,
            ") AS e(receipt, scope, operation_key, step, kind, name, call_id, body, pins, ",
            "input_tokens, output_tokens, ttl_ms, fence) CROSS JOIN clock WHERE ",
            $filter,
            " ON CONFLICT (scope, operation_key, step) DO NOTHING"
        )
    };
}

/// Postgres's part: the rows appended, and each written one's (scope, operation key, step).
const PG_INSERT: PgPart = PgPart::new(
    concat!(
        "appended AS (",
        pg_insert!(
            "$1::text[], $2::text[], $3::text[], $4::int8[], $5::text[], $6::text[], $7::text[], \
             $8::text[], $9::text[], $10::int8[], $11::int8[], $12::int8[], $13::int8[]",
            holds_lease!(" FOR SHARE")
        ),
        " RETURNING scope, operation_key, step)"
    ),
    "json_build_array(scope, operation_key, step)::text FROM appended",
    false,
);

/// The journal half of the receipts' group insert on Postgres (`$8 … $20`, after the seven
/// receipt arrays): a data-modifying CTE that writes the rows of the receipts its
/// `charged` CTE inserted, in the same statement and so the same commit.
macro_rules! pg_with_charged {
    () => {
        concat!(
            "charge_steps AS (",
            $crate::journal::pg_insert!(
                "$8::text[], $9::text[], $10::text[], $11::int8[], $12::text[], $13::text[], $14::text[], \
                 $15::text[], $16::text[], $17::int8[], $18::int8[], $19::int8[], $20::int8[]",
                concat!(
                    "e.receipt IN (SELECT id FROM charged) AND ",
                    $crate::journal::holds_lease!(" FOR SHARE")
                )
            ),
            ")"
        )
    };
}
pub(crate) use {columns, holds_lease, pg_insert, pg_with_charged};

/// SQLite's: the rows are one JSON array (`db::Batch::push_rows`), its `UNNEST`; a row
/// names the receipt it commits with, or null.
const SQLITE_INSERT: &str = concat!(
    "INSERT INTO agent_journal (",
    columns!(),
    ") SELECT e.scope, e.operation_key, e.step, e.kind, e.name, e.call_id, e.body, e.pins, ",
    "e.input_tokens, e.output_tokens, (SELECT now_ms FROM clock) + e.ttl_ms FROM (SELECT ",
    "value ->> 0 AS scope, value ->> 1 AS operation_key, value ->> 2 AS step, value ->> 3 AS kind, ",
    "value ->> 4 AS name, value ->> 5 AS call_id, value ->> 6 AS body, value ->> 7 AS pins, ",
    "value ->> 8 AS input_tokens, value ->> 9 AS output_tokens, value ->> 10 AS ttl_ms, ",
    "value ->> 11 AS fence, value ->> 12 AS receipt FROM jsonb_each(?)) AS e WHERE ",
    holds_lease!(""),
    " AND (e.receipt IS NULL OR EXISTS (SELECT 1 FROM receipts r WHERE r.id = e.receipt)) ",
    "ON CONFLICT (scope, operation_key, step) DO NOTHING RETURNING json_array(scope, operation_key, step)"
);

/// The group writer's side of the table, and the streams to wake when its rows commit.
struct Entries(Arc<Wake>);

impl GroupWrite for Entries {
    /// One operation's next steps, appended together.
    type Row = Vec<NewEntry>;
    /// Whether every one of them was written.
    type Out = bool;

    fn order(a: &Vec<NewEntry>, b: &Vec<NewEntry>) -> Ordering {
        let first = |rows: &Vec<NewEntry>| {
            rows.first()
                .map(|r| (r.key.caller.clone(), r.key.operation_key.clone(), r.step))
        };
        first(a).cmp(&first(b))
    }

    fn push_pg(&self, batch: &mut PgBatch, rows: &[Vec<NewEntry>]) {
        push_postgres(batch, rows.iter().flatten().map(|r| (None, r)));
    }

    fn read_pg(
        &self,
        rows: &[Vec<NewEntry>],
        returned: &mut Returned,
    ) -> Result<Vec<bool>, StoreError> {
        Ok(all_written(rows, returned.rows()?))
    }

    fn push(&self, batch: &mut Batch, rows: &[Vec<NewEntry>]) {
        let entries: Vec<_> = rows.iter().flatten().map(|r| (None, r)).collect();
        push_sqlite(batch, &entries);
    }

    fn read(
        &self,
        rows: &[Vec<NewEntry>],
        returned: &mut Returned,
    ) -> Result<Vec<bool>, StoreError> {
        Ok(all_written(rows, returned.rows()?))
    }

    /// The streams may read the rows now.
    fn committed(&self, rows: &[Vec<NewEntry>]) {
        self.0.committed(rows.iter().flatten());
    }
}

/// Whether every step of each row of `rows` is among those `written`.
fn all_written(rows: &[Vec<NewEntry>], written: Vec<(String, String, i64)>) -> Vec<bool> {
    let written: HashSet<(String, String, i64)> = written.into_iter().collect();
    rows.iter()
        .map(|steps| {
            steps.iter().all(|r| {
                written.contains(&(r.key.caller.clone(), r.key.operation_key.clone(), r.step))
            })
        })
        .collect()
}

/// Postgres's insert of `rows` as a part of `batch`: a row goes in when it holds its
/// lease. The part returns the (scope, operation key, step) of those written.
fn push_postgres<'r>(
    batch: &mut PgBatch,
    rows: impl Iterator<Item = (Option<String>, &'r NewEntry)>,
) {
    let entries = PgEntries::of(rows);
    batch.part(PG_INSERT, |b| entries.bind(b));
}

/// Inserts `rows` on `conn` (a transaction that commits them with an effect of its
/// own: a refund); the rows whose lease is no longer theirs are not written.
pub(crate) async fn insert_in(conn: Conn<'_>, rows: &[NewEntry]) -> Result<usize, StoreError> {
    if rows.is_empty() {
        return Ok(0);
    }
    Ok(match conn {
        Conn::Postgres(c) => {
            let mut batch = PgBatch::default();
            push_postgres(&mut batch, rows.iter().map(|r| (None, r)));
            batch.run(c).await?.rows::<(String, String, i64)>()?
        }
        Conn::Sqlite(c) => {
            let mut batch = Batch::default();
            push_sqlite(
                &mut batch,
                &rows.iter().map(|r| (None, r)).collect::<Vec<_>>(),
            );
            batch.run_sqlx(c).await?.rows::<(String, String, i64)>()?
        }
    }
    .len())
}

/// SQLite's insert of `rows` as a statement of `batch`. A row
/// goes in when it holds its lease and, if it names a receipt (a charge's steps, which
/// commit with it), that receipt is there. The statement returns the (scope, operation
/// key, step) of those written.
pub(crate) fn push_sqlite(batch: &mut Batch, rows: &[(Option<String>, &NewEntry)]) {
    let rows: Vec<_> = rows
        .iter()
        .map(|(receipt, r)| {
            let key = &r.key;
            (
                &key.caller,
                &key.operation_key,
                r.step,
                r.kind.as_str(),
                &r.name,
                &r.call_id,
                &r.body,
                &r.pins,
                r.input_tokens,
                r.output_tokens,
                r.ttl_ms,
                key.fence,
                receipt,
            )
        })
        .collect();
    batch.push_rows(SQLITE_INSERT, rows);
}

/// Rows as Postgres arrays, bound in the order [`pg_insert!`] names them; `receipt` is the
/// receipt a row commits with (the receipts' group insert), or NULL.
#[derive(Default)]
pub(crate) struct PgEntries {
    receipt: Vec<Option<String>>,
    caller: Vec<String>,
    operation_key: Vec<String>,
    step: Vec<i64>,
    kind: Vec<&'static str>,
    name: Vec<String>,
    call_id: Vec<Option<String>>,
    body: Vec<String>,
    pins: Vec<Option<String>>,
    input_tokens: Vec<Option<i64>>,
    output_tokens: Vec<Option<i64>>,
    ttl_ms: Vec<i64>,
    fence: Vec<Option<i64>>,
}

impl PgEntries {
    pub(crate) fn of<'r>(rows: impl Iterator<Item = (Option<String>, &'r NewEntry)>) -> PgEntries {
        let mut arrays = PgEntries::default();
        for (receipt, row) in rows {
            arrays.receipt.push(receipt);
            arrays.caller.push(row.key.caller.clone());
            arrays.operation_key.push(row.key.operation_key.clone());
            arrays.step.push(row.step);
            arrays.kind.push(row.kind.as_str());
            arrays.name.push(row.name.clone());
            arrays.call_id.push(row.call_id.clone());
            arrays.body.push(row.body.clone());
            arrays.pins.push(row.pins.clone());
            arrays.input_tokens.push(row.input_tokens);
            arrays.output_tokens.push(row.output_tokens);
            arrays.ttl_ms.push(row.ttl_ms);
            arrays.fence.push(row.key.fence);
        }
        arrays
    }

    pub(crate) fn bind(self, b: &mut PgBinder<'_>) {
        b.bind(self.receipt)
            .bind(self.caller)
            .bind(self.operation_key)
            .bind(self.step)
            .bind(self.kind)
            .bind(self.name)
            .bind(self.call_id)
            .bind(self.body)
            .bind(self.pins)
            .bind(self.input_tokens)
            .bind(self.output_tokens)
            .bind(self.ttl_ms)
            .bind(self.fence);
    }
}
