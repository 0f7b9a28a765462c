//! Lease renewals in groups. Every keyed operation renews its lease a third of the way
//! through it; with thousands in flight (bench figure 12: 10,000 streamed checkouts, each
//! keyed) one statement and one commit per renewal took SQLite's one connection for
//! seconds (a commit waits for the disk), and the streams' reads, the saved answers and
//! the renewals themselves timed out waiting for it. On SQLite, renewals that come
//! together are one statement and one commit (`db::GroupWriter`), as a new key's insert
//! and a saved answer are. On Postgres each is a statement of its own, as before: there
//! the pool has connections to spare, and a group's `UPDATE` of hundreds of records,
//! holding them all until it commits, stalled the journal's inserts (which share-lock
//! their record) for seconds in two of four runs of figure 12.

use std::cmp::Ordering;
use std::time::Duration;

use super::records::{Lease, bind_leases, held};
use crate::db::{Batch, Conn, GroupWrite, PgBatch, PgPart, Returned, StoreError, on_conn};

/// A lease to extend by `lease_ms` from now.
#[derive(Debug)]
pub struct Renewal {
    pub lease: Lease,
    pub lease_ms: i64,
}

impl Renewal {
    pub fn new(lease: &Lease, lease_for: Duration) -> Renewal {
        Renewal {
            lease: lease.clone(),
            lease_ms: i64::try_from(lease_for.as_millis()).unwrap_or(i64::MAX),
        }
    }
}

const RENEW: &str = "\
    UPDATE idempotency_keys SET lease_until = (SELECT now_ms FROM clock) + $4 \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL";

/// Extends one lease on `conn`; false when it is no longer ours.
pub async fn renew(conn: Conn<'_>, renewal: &Renewal) -> Result<bool, StoreError> {
    let lease = &renewal.lease;
    let done = on_conn!(conn, c => sqlx::query(RENEW)
        .bind(&lease.caller)
        .bind(&lease.key)
        .bind(lease.fence)
        .bind(renewal.lease_ms)
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// SQLite's group: the rows are one JSON array (`db::Batch::push_rows`).
const SQLITE_RENEW_GROUP: &str = "\
    UPDATE idempotency_keys SET lease_until = (SELECT now_ms FROM clock) + r.lease_ms \
    FROM (SELECT value ->> 0 AS scope, value ->> 1 AS key, value ->> 2 AS fence, value ->> 3 AS lease_ms \
    FROM jsonb_each(?)) AS r \
    WHERE idempotency_keys.scope = r.scope AND idempotency_keys.key = r.key \
    AND idempotency_keys.fence = r.fence AND idempotency_keys.status IS NULL \
    RETURNING json_array(scope, key, fence)";

/// The group writer's side of lease renewals.
/// Postgres's part: leases extended, a group at a time; the keys renewed.
const PG_RENEW_GROUP: PgPart = PgPart::new(
    "renewed AS (\
        UPDATE idempotency_keys SET lease_until = clock.now_ms + r.lease_ms \
        FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[]) AS r(scope, key, fence, lease_ms), clock \
        WHERE idempotency_keys.scope = r.scope AND idempotency_keys.key = r.key \
        AND idempotency_keys.fence = r.fence AND idempotency_keys.status IS NULL \
        RETURNING idempotency_keys.scope, idempotency_keys.key, idempotency_keys.fence)",
    "json_build_array(scope, key, fence)::text FROM renewed",
    false,
);

pub struct Renewals;

impl GroupWrite for Renewals {
    type Row = Renewal;
    /// Whether the lease was extended (false: it is no longer this run's).
    type Out = bool;

    fn order(a: &Renewal, b: &Renewal) -> Ordering {
        (&a.lease.caller, &a.lease.key).cmp(&(&b.lease.caller, &b.lease.key))
    }

    /// Only SQLite's renewals are written in groups (`Records::renew`): on Postgres a
    /// group's UPDATE held its records until it committed, and stalled the journal's
    /// inserts behind it, so each goes alone on the pool and none comes here. (One that
    /// did would share its statement with the other tables' parts, and a statement that
    /// updates one row in two of its parts applies only one of them: a renewal beside its
    /// operation's saved answer could cost the answer.)
    fn push_pg(&self, batch: &mut PgBatch, rows: &[Renewal]) {
        batch.part(PG_RENEW_GROUP, |b| {
            bind_leases(b, rows.iter().map(|r| &r.lease));
            b.bind(rows.iter().map(|r| r.lease_ms).collect::<Vec<_>>());
        });
    }

    fn read_pg(&self, rows: &[Renewal], returned: &mut Returned) -> Result<Vec<bool>, StoreError> {
        Ok(held(rows.iter().map(|r| &r.lease), returned.rows()?))
    }

    fn push(&self, batch: &mut Batch, rows: &[Renewal]) {
        let rows: Vec<_> = rows
            .iter()
            .map(|r| (&r.lease.caller, &r.lease.key, r.lease.fence, r.lease_ms))
            .collect();
        batch.push_rows(SQLITE_RENEW_GROUP, rows);
    }

    fn read(&self, rows: &[Renewal], returned: &mut Returned) -> Result<Vec<bool>, StoreError> {
        Ok(held(rows.iter().map(|r| &r.lease), returned.rows()?))
    }
}
