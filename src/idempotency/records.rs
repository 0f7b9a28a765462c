//! The `idempotency_keys` table: one row per key, with its lease, fence and saved answer.
//! Every statement is one text for both databases, timed by their `clock` view.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::db::{
    Batch, Conn, GroupWrite, PgBatch, PgBinder, PgPart, Returned, StoreError, on_conn,
};
use crate::journal::wake::Wake;
use crate::journal::{self, NewEntry, PgEntries};

/// The right to work on a key, until the lease lapses or another instance takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub caller: String,
    pub key: String,
    pub fence: i64,
}

/// A finished answer, kept for replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// A record as read, with its times already compared against the database's clock.
#[derive(Debug)]
pub struct Record {
    pub fingerprint: String,
    pub fence: i64,
    pub saved: Option<Saved>,
    /// How long the lease still runs (zero when it has lapsed).
    pub lease_left: Duration,
    pub expired: bool,
}

const INSERT: &str = "\
    INSERT INTO idempotency_keys (scope, key, fingerprint, fence, lease_until, created_at, expires_at, request) \
    SELECT $1, $2, $3, 1, now_ms + $4, now_ms, now_ms + $5, $6 FROM clock WHERE true \
    ON CONFLICT (scope, key) DO NOTHING RETURNING fence";

const READ: &str = "\
    SELECT fingerprint, fence, status, content_type, body, lease_until, expires_at, now_ms \
    FROM idempotency_keys, clock WHERE scope = $1 AND key = $2";

const FORGET_EXPIRED: &str = "\
    DELETE FROM idempotency_keys \
    WHERE scope = $1 AND key = $2 AND expires_at <= (SELECT now_ms FROM clock)";

const TAKE_OVER: &str = "\
    UPDATE idempotency_keys SET fence = fence + 1, lease_until = (SELECT now_ms FROM clock) + $4 \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL \
    AND lease_until <= (SELECT now_ms FROM clock) \
    RETURNING fence";

const RELEASE: &str = "\
    UPDATE idempotency_keys SET lease_until = (SELECT now_ms FROM clock) \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL";

const SWEEP: &str = "DELETE FROM idempotency_keys WHERE expires_at <= (SELECT now_ms FROM clock)";

/// The status of an operation paused for a person's approval: its saved answer is the 202
/// that says so, replayed to its client until the decision replaces it.
pub const PAUSED: u16 = 202;

// The statements of a pause and its decision. Each runs in the transaction that records
// the approval or its decision (`approvals`), so that an approval is pending exactly while
// its operation's record holds the 202.

/// The run holding the lease (`$3`: its fence) pauses: the 202 is saved (`$4`, `$5`:
/// content type, body) and the record kept at least until `$6` (epoch ms).
pub const PAUSE: &str = "\
    UPDATE idempotency_keys SET status = 202, content_type = $4, body = $5, lease_until = NULL, \
    expires_at = CASE WHEN expires_at < $6 THEN $6 ELSE expires_at END \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL";

/// Approved: the record runs again under a new fence, as a takeover (`$3`: the lease in
/// ms). Only from the 202: the first to reopen it runs it.
pub const REOPEN: &str = "\
    UPDATE idempotency_keys SET status = NULL, content_type = NULL, body = NULL, \
    fence = fence + 1, lease_until = (SELECT now_ms FROM clock) + $3 \
    WHERE scope = $1 AND key = $2 AND status = 202 \
    RETURNING fence";

/// Denied or expired: the operation's answer replaces the 202 (`$3 … $5`: status,
/// content type, body).
pub const SETTLE_PAUSED: &str = "\
    UPDATE idempotency_keys SET status = $3, content_type = $4, body = $5 \
    WHERE scope = $1 AND key = $2 AND status = 202";

/// Unfinished records whose lease lapsed at least `$1` ms ago, and the sweep has not
/// given up on: the recovery sweep's candidates, 16 at most (a limit written in the text,
/// which SQLite keeps prepared: see `db::sqlite_test`).
const LAPSED: &str = "\
    SELECT scope, key, fence, request, recoveries FROM idempotency_keys, clock \
    WHERE status IS NULL AND lease_until <= now_ms - $1 AND expires_at > now_ms \
    AND attention_at IS NULL AND request IS NOT NULL ORDER BY lease_until LIMIT 16";

/// A takeover by the recovery sweep: as the client's retry takes one (a new fence), and
/// counted, while fewer than `$5` recoveries were tried.
const RECOVER: &str = "\
    UPDATE idempotency_keys SET fence = fence + 1, recoveries = recoveries + 1, \
    lease_until = (SELECT now_ms FROM clock) + $4 \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL AND attention_at IS NULL \
    AND recoveries < $5 AND lease_until <= (SELECT now_ms FROM clock) \
    RETURNING fence";

/// The sweep gives up on a record it recovered `$4` times: it needs an operator.
const GIVE_UP: &str = "\
    UPDATE idempotency_keys SET attention_at = (SELECT now_ms FROM clock) \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL AND attention_at IS NULL \
    AND recoveries >= $4 AND lease_until <= (SELECT now_ms FROM clock)";

/// New keys' records, a group at a time (`$1 … $6`: callers, keys, fingerprints, lease and
/// time-to-live in ms, requests): the keys that went in, with their fence.
///
/// A claim may commit without waiting for its own WAL flush (`synchronous_commit` off for
/// the statement's transaction, when it holds only claims: with a charge or a saved answer
/// in it, it commits with theirs): nothing depends on its durability until the
/// operation's next write, and every such write (the receipt, a provider's intent, a
/// journal step, the pause, the saved answer, the release) commits synchronously, which
/// flushes the WAL up to itself and so the claim before it. A crash before that loses a
/// claim that no effect depended on: the request is as if it never came, and its retry
/// claims the key afresh. A keyed checkout waits for two flushes, not three (issue 34).
const PG_INSERT_GROUP: PgPart = PgPart::new(
    "claimed AS (\
        INSERT INTO idempotency_keys (scope, key, fingerprint, fence, lease_until, created_at, expires_at, request) \
        SELECT r.scope, r.key, r.fingerprint, 1, clock.now_ms + r.lease_ms, clock.now_ms, clock.now_ms + r.ttl_ms, r.request \
        FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[], $6::text[]) \
        AS r(scope, key, fingerprint, lease_ms, ttl_ms, request) CROSS JOIN clock CROSS JOIN unflushed \
        ON CONFLICT (scope, key) DO NOTHING RETURNING scope, key, fence)",
    "json_build_array(scope, key, fence)::text FROM claimed",
    true,
);

/// SQLite's: the rows are one JSON array (`db::Batch::push_rows`), its `UNNEST`.
const SQLITE_INSERT_GROUP: &str = "\
    INSERT INTO idempotency_keys (scope, key, fingerprint, fence, lease_until, created_at, expires_at, request) \
    SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, 1, clock.now_ms + (r.value ->> 3), \
    clock.now_ms, clock.now_ms + (r.value ->> 4), r.value ->> 5 \
    FROM jsonb_each(?) AS r, clock WHERE true \
    ON CONFLICT (scope, key) DO NOTHING RETURNING json_array(scope, key, fence)";

/// Answers saved, a group at a time (`$1 … $6`: callers, keys, fences, statuses, content
/// types, bodies), each only under the fence its run holds: the keys saved. And, in the
/// same statement (so the same commit), the closing journal steps of those saved
/// (`$7 … $19`, the journal's arrays).
const PG_COMPLETE_GROUP: PgPart = PgPart::new(
    concat!(
        "saved AS (",
        "UPDATE idempotency_keys SET status = c.status, content_type = c.content_type, body = c.body, lease_until = NULL ",
        "FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::bytea[]) ",
        "AS c(scope, key, fence, status, content_type, body) ",
        "WHERE idempotency_keys.scope = c.scope AND idempotency_keys.key = c.key ",
        "AND idempotency_keys.fence = c.fence AND idempotency_keys.status IS NULL ",
        "RETURNING idempotency_keys.scope, idempotency_keys.key, idempotency_keys.fence), ",
        "closing_steps AS (",
        journal::pg_insert!(
            "$7::text[], $8::text[], $9::text[], $10::int8[], $11::text[], $12::text[], $13::text[], \
             $14::text[], $15::text[], $16::int8[], $17::int8[], $18::int8[], $19::int8[]",
            "(e.scope, e.operation_key, e.fence) IN (SELECT scope, key, fence FROM saved)"
        ),
        ")"
    ),
    "json_build_array(scope, key, fence)::text FROM saved",
    false,
);

/// SQLite's: the rows are one JSON array, each body in hexadecimal.
const SQLITE_COMPLETE_GROUP: &str = "\
    UPDATE idempotency_keys SET status = c.status, content_type = c.content_type, body = c.body, lease_until = NULL \
    FROM (SELECT value ->> 0 AS scope, value ->> 1 AS key, value ->> 2 AS fence, value ->> 3 AS status, \
    value ->> 4 AS content_type, unhex(value ->> 5) AS body FROM jsonb_each(?)) AS c \
    WHERE idempotency_keys.scope = c.scope AND idempotency_keys.key = c.key \
    AND idempotency_keys.fence = c.fence AND idempotency_keys.status IS NULL \
    RETURNING json_array(scope, key, fence)";

/// A new key's record, about to be inserted with the next group.
#[derive(Debug)]
pub struct NewRecord {
    pub caller: String,
    pub key: String,
    pub fingerprint: String,
    /// What the recovery sweep rebuilds the operation from.
    pub request: String,
    pub lease: Duration,
    pub ttl: Duration,
}

/// An answer to save under a lease, with the next group, and the journal steps that
/// commit with it.
#[derive(Debug)]
pub struct Completion {
    pub lease: Lease,
    pub saved: Saved,
    pub closing: Vec<NewEntry>,
}

/// The group writer of new keys' records: every checkout with a new key inserts one, so
/// those that arrive together share a statement and a commit (on SQLite, where each
/// commit waits for the disk and one connection serves all, one after the other).
pub struct Inserts;

impl GroupWrite for Inserts {
    type Row = NewRecord;
    /// The fence when this row's record went in; `None` when the key had one already.
    type Out = Option<i64>;

    fn order(a: &NewRecord, b: &NewRecord) -> Ordering {
        (&a.caller, &a.key).cmp(&(&b.caller, &b.key))
    }

    fn push_pg(&self, batch: &mut PgBatch, rows: &[NewRecord]) {
        batch.part(PG_INSERT_GROUP, |b| {
            b.bind(rows.iter().map(|r| r.caller.as_str()).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.key.as_str()).collect::<Vec<_>>())
                .bind(
                    rows.iter()
                        .map(|r| r.fingerprint.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(rows.iter().map(|r| millis(r.lease)).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| millis(r.ttl)).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.request.as_str()).collect::<Vec<_>>());
        });
    }

    fn read_pg(
        &self,
        rows: &[NewRecord],
        returned: &mut Returned,
    ) -> Result<Vec<Option<i64>>, StoreError> {
        Ok(fences(rows, returned.rows()?))
    }

    fn push(&self, batch: &mut Batch, rows: &[NewRecord]) {
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                let (lease, ttl) = (millis(r.lease), millis(r.ttl));
                (&r.caller, &r.key, &r.fingerprint, lease, ttl, &r.request)
            })
            .collect();
        batch.push_rows(SQLITE_INSERT_GROUP, rows);
    }

    fn read(
        &self,
        rows: &[NewRecord],
        returned: &mut Returned,
    ) -> Result<Vec<Option<i64>>, StoreError> {
        Ok(fences(rows, returned.rows()?))
    }
}

/// Each new key's fence, if its record is among those `made`. Two requests with one key
/// in one group: the record is the first's; the other finds it, as it would have a
/// moment later.
fn fences(rows: &[NewRecord], made: Vec<(String, String, i64)>) -> Vec<Option<i64>> {
    let mut made: HashMap<(String, String), i64> = made
        .into_iter()
        .map(|(caller, key, fence)| ((caller, key), fence))
        .collect();
    rows.iter()
        .map(|r| made.remove(&(r.caller.clone(), r.key.clone())))
        .collect()
}

/// The group writer of saved answers: every keyed checkout saves one as it ends.
pub struct Completions(pub Arc<Wake>);

impl GroupWrite for Completions {
    type Row = Completion;
    /// Whether the answer was saved (false: the lease is no longer this run's).
    type Out = bool;

    fn order(a: &Completion, b: &Completion) -> Ordering {
        (&a.lease.caller, &a.lease.key).cmp(&(&b.lease.caller, &b.lease.key))
    }

    fn push_pg(&self, batch: &mut PgBatch, rows: &[Completion]) {
        let closing = PgEntries::of(rows.iter().flat_map(|r| &r.closing).map(|e| (None, e)));
        batch.part(PG_COMPLETE_GROUP, |b| {
            bind_leases(b, rows.iter().map(|r| &r.lease));
            b.bind(
                rows.iter()
                    .map(|r| i64::from(r.saved.status))
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|r| r.saved.content_type.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|r| r.saved.body.as_slice())
                    .collect::<Vec<_>>(),
            );
            closing.bind(b);
        });
    }

    fn read_pg(
        &self,
        rows: &[Completion],
        returned: &mut Returned,
    ) -> Result<Vec<bool>, StoreError> {
        Ok(held(rows.iter().map(|r| &r.lease), returned.rows()?))
    }

    /// The steps first: their insert asks, as the save does, that the record be
    /// unfinished under the run's fence; the save then ends it.
    fn push(&self, batch: &mut Batch, rows: &[Completion]) {
        let closing: Vec<_> = rows
            .iter()
            .flat_map(|r| &r.closing)
            .map(|e| (None, e))
            .collect();
        journal::push_sqlite(batch, &closing);
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                let (lease, saved) = (&r.lease, &r.saved);
                let body = hex::encode(&saved.body);
                (
                    &lease.caller,
                    &lease.key,
                    lease.fence,
                    saved.status,
                    &saved.content_type,
                    body,
                )
            })
            .collect();
        batch.push_rows(SQLITE_COMPLETE_GROUP, rows);
    }

    fn read(&self, rows: &[Completion], returned: &mut Returned) -> Result<Vec<bool>, StoreError> {
        returned.skip();
        Ok(held(rows.iter().map(|r| &r.lease), returned.rows()?))
    }

    /// The closing steps committed: streams following them here read them now.
    fn committed(&self, rows: &[Completion]) {
        self.0.committed(rows.iter().flat_map(|r| &r.closing));
    }
}

/// Binds the callers, keys and fences of `leases`, three arrays of a Postgres part.
pub(super) fn bind_leases<'l>(
    b: &mut PgBinder<'_>,
    leases: impl Iterator<Item = &'l Lease> + Clone,
) {
    b.bind(
        leases
            .clone()
            .map(|l| l.caller.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(leases.clone().map(|l| l.key.as_str()).collect::<Vec<_>>())
    .bind(leases.map(|l| l.fence).collect::<Vec<_>>());
}

/// Whether each of `leases` is among the (caller, key, fence) a group's statement
/// `returned`. Named by fence too: a zombie's row beside its successor's in one group is
/// not told that the successor's write was its own.
pub(super) fn held<'l>(
    leases: impl Iterator<Item = &'l Lease>,
    returned: Vec<(String, String, i64)>,
) -> Vec<bool> {
    let returned: HashSet<(String, String, i64)> = returned.into_iter().collect();
    leases
        .map(|lease| returned.contains(&(lease.caller.clone(), lease.key.clone(), lease.fence)))
        .collect()
}

/// An unfinished operation whose lease lapsed.
#[derive(Debug, sqlx::FromRow)]
pub struct Lapsed {
    /// The caller (its column keeps its first name, `scope`).
    #[sqlx(rename = "scope")]
    pub caller: String,
    pub key: String,
    pub fence: i64,
    /// What it was asked, as its handler recorded it.
    pub request: String,
    /// Times the recovery sweep took it over already.
    pub recoveries: i64,
}

/// Up to 16 operations whose lease lapsed at least `grace` ago.
pub async fn lapsed(conn: Conn<'_>, grace: Duration) -> Result<Vec<Lapsed>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_as(LAPSED)
        .bind(millis(grace))
        .fetch_all(c)
        .await?))
}

/// Takes a lapsed operation over for the recovery sweep: its new lease, or `None` when
/// someone else got there first (or it is out of recoveries).
pub async fn recover(
    conn: Conn<'_>,
    lapsed: &Lapsed,
    lease: Duration,
    max: i64,
) -> Result<Option<Lease>, StoreError> {
    let fence: Option<i64> = on_conn!(conn, c => sqlx::query_scalar(RECOVER)
        .bind(&lapsed.caller)
        .bind(&lapsed.key)
        .bind(lapsed.fence)
        .bind(millis(lease))
        .bind(max)
        .fetch_optional(c)
        .await?);
    Ok(fence.map(|fence| Lease {
        caller: lapsed.caller.clone(),
        key: lapsed.key.clone(),
        fence,
    }))
}

/// Marks an operation the sweep recovered `max` times as needing attention; true when
/// this call marked it.
pub async fn give_up(conn: Conn<'_>, lapsed: &Lapsed, max: i64) -> Result<bool, StoreError> {
    let done = on_conn!(conn, c => sqlx::query(GIVE_UP)
        .bind(&lapsed.caller)
        .bind(&lapsed.key)
        .bind(lapsed.fence)
        .bind(max)
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// Inserts a fresh record with fence 1, unless the key exists. The fence, if inserted.
/// `request` is what the recovery sweep rebuilds the operation from.
pub async fn insert(
    conn: Conn<'_>,
    caller: &str,
    key: &str,
    fingerprint: &str,
    request: &str,
    lease: Duration,
    ttl: Duration,
) -> Result<Option<i64>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_scalar(INSERT)
        .bind(caller)
        .bind(key)
        .bind(fingerprint)
        .bind(millis(lease))
        .bind(millis(ttl))
        .bind(request)
        .fetch_optional(c)
        .await?))
}

pub async fn read(conn: Conn<'_>, caller: &str, key: &str) -> Result<Option<Record>, StoreError> {
    let row: Option<Stored> = on_conn!(conn, c => sqlx::query_as(READ)
        .bind(caller)
        .bind(key)
        .fetch_optional(c)
        .await?);
    row.map(Stored::into_record).transpose()
}

/// Deletes the record if it has expired.
pub async fn forget_expired(conn: Conn<'_>, caller: &str, key: &str) -> Result<(), StoreError> {
    on_conn!(conn, c => sqlx::query(FORGET_EXPIRED)
        .bind(caller)
        .bind(key)
        .execute(c)
        .await
        .map(drop))?;
    Ok(())
}

/// Takes over an unfinished record whose lease lapsed, if its fence is still `fence`:
/// the new fence, or `None` when someone else got there first.
pub async fn take_over(
    conn: Conn<'_>,
    caller: &str,
    key: &str,
    fence: i64,
    lease: Duration,
) -> Result<Option<i64>, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query_scalar(TAKE_OVER)
        .bind(caller)
        .bind(key)
        .bind(fence)
        .bind(millis(lease))
        .fetch_optional(c)
        .await?))
}

/// Ends the lease now without an answer, so the next request runs the operation again.
pub async fn release(conn: Conn<'_>, lease: &Lease) -> Result<bool, StoreError> {
    let done = on_conn!(conn, c => sqlx::query(RELEASE)
        .bind(&lease.caller)
        .bind(&lease.key)
        .bind(lease.fence)
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// The request a record keeps (what the recovery sweep and an approval resume from).
pub async fn request(
    conn: Conn<'_>,
    caller: &str,
    key: &str,
) -> Result<Option<String>, StoreError> {
    let found: Option<Option<String>> = on_conn!(conn, c => sqlx::query_scalar(
        "SELECT request FROM idempotency_keys WHERE scope = $1 AND key = $2")
        .bind(caller)
        .bind(key)
        .fetch_optional(c)
        .await?);
    Ok(found.flatten())
}

/// Deletes expired records; how many.
pub async fn sweep(conn: Conn<'_>) -> Result<u64, StoreError> {
    Ok(on_conn!(conn, c => sqlx::query(SWEEP).execute(c).await?.rows_affected()))
}

/// A row as both databases return it, with the database's time beside it.
#[derive(sqlx::FromRow)]
struct Stored {
    fingerprint: String,
    fence: i64,
    status: Option<i64>,
    content_type: Option<String>,
    body: Option<Vec<u8>>,
    lease_until: Option<i64>,
    expires_at: i64,
    now_ms: i64,
}

impl Stored {
    fn into_record(self) -> Result<Record, StoreError> {
        let saved = match self.status {
            None => None,
            Some(status) => Some(Saved {
                status: u16::try_from(status)
                    .map_err(|_| StoreError::Corrupt(format!("saved status {status}")))?,
                content_type: self.content_type.unwrap_or_default(),
                body: self.body.unwrap_or_default(),
            }),
        };
        let lease_left = self
            .lease_until
            .map_or(0, |until| until - self.now_ms)
            .max(0);
        Ok(Record {
            fingerprint: self.fingerprint,
            fence: self.fence,
            saved,
            lease_left: Duration::from_millis(lease_left as u64),
            expired: self.expires_at <= self.now_ms,
        })
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::sqlite_test::{prepared_again, schema};

    // The recovery sweep asks at every lease period.
    // Seen failing with the limit a parameter (`LIMIT $2`, 16 bound): left 3, right 0.
    #[test]
    fn the_recovery_sweeps_question_stays_prepared_on_sqlite() {
        assert_eq!(prepared_again(&schema(), LAPSED, &[&30_000]), 0);
    }
}
