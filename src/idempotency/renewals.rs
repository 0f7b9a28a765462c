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
use std::collections::HashSet;
use std::time::Duration;

use sqlx::QueryBuilder;

use super::records::Lease;
use crate::db::{Conn, GroupWrite, StoreError, on_conn};

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

const SQLITE_RENEW_GROUP_HEAD: &str = "\
    UPDATE idempotency_keys SET lease_until = (SELECT now_ms FROM clock) + r.column4 FROM (";
const SQLITE_RENEW_GROUP_TAIL: &str = ") AS r \
    WHERE idempotency_keys.scope = r.column1 AND idempotency_keys.key = r.column2 \
    AND idempotency_keys.fence = r.column3 AND idempotency_keys.status IS NULL \
    RETURNING scope, key, fence";

/// The group writer's side of lease renewals.
pub struct Renewals;

impl GroupWrite for Renewals {
    type Row = Renewal;
    /// Whether the lease was extended (false: it is no longer this run's).
    type Out = bool;

    fn order(a: &Renewal, b: &Renewal) -> Ordering {
        (&a.lease.caller, &a.lease.key).cmp(&(&b.lease.caller, &b.lease.key))
    }

    async fn write(&self, conn: Conn<'_>, rows: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        let renewed: Vec<(String, String, i64)> = match conn {
            // Only SQLite's renewals come here (`Records::renew`): on Postgres a group's
            // UPDATE held its records until it committed, and stalled the journal's
            // inserts behind it. Should one come, it goes alone.
            Conn::Postgres(c) => {
                let mut renewed = Vec::with_capacity(rows.len());
                for r in rows {
                    if renew(Conn::Postgres(&mut *c), r).await? {
                        let lease = &r.lease;
                        renewed.push((lease.caller.clone(), lease.key.clone(), lease.fence));
                    }
                }
                renewed
            }
            Conn::Sqlite(c) => {
                let mut statement = QueryBuilder::new(SQLITE_RENEW_GROUP_HEAD);
                statement.push_values(rows, |mut values, r| {
                    values
                        .push_bind(r.lease.caller.clone())
                        .push_bind(r.lease.key.clone())
                        .push_bind(r.lease.fence)
                        .push_bind(r.lease_ms);
                });
                statement.push(SQLITE_RENEW_GROUP_TAIL);
                statement
                    .build_query_as()
                    .persistent(crate::db::keep_prepared(rows.len()))
                    .fetch_all(c)
                    .await?
            }
        };
        // Named by fence too: a zombie's renewal beside its successor's in one group is
        // not told that the successor's was its own.
        let renewed: HashSet<(String, String, i64)> = renewed.into_iter().collect();
        Ok(rows
            .iter()
            .map(|r| {
                let lease = &r.lease;
                renewed.contains(&(lease.caller.clone(), lease.key.clone(), lease.fence))
            })
            .collect())
    }
}
