//! `Idempotency-Key` records (draft-ietf-httpapi-idempotency-key-header): the first
//! request with a key records its fingerprint and, once finished, its answer; a repeat
//! gets that answer back without running again.
//!
//! The instance working on a key holds a lease with a fencing token: a deadline it
//! renews while it works, and a number that grows on every takeover. Every write names
//! the fence it expects, so an instance whose lease was taken over (a zombie: paused,
//! partitioned, slow) cannot write its late answer over the new owner's. No advisory
//! locks: the primary key and conditional updates decide every race, so the same SQL
//! runs on Postgres-compatible distributed databases.

mod postgres;
mod sqlite;

use std::future::Future;
use std::time::Duration;

pub use postgres::PgRecords;
pub use sqlite::SqliteRecords;

use crate::db::{Database, StoreError};
use crate::payments::Order;

/// Who is calling. An authentication layer that knows the caller inserts this into the
/// request's extensions, and keys are then scoped to it: two callers may use the same key
/// without meeting. Without it, every request is the anonymous caller (scope `""`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller(pub String);

/// What makes two requests the same request: method, path, and the canonical order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn of_checkout(order: &Order) -> Fingerprint {
        Fingerprint(format!(
            "POST /checkout orderId={} amount={} currency={}",
            order.id(),
            order.amount().minor(),
            order.amount().currency()
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The right to work on a key, until the lease lapses or another instance takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub scope: String,
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

impl Saved {
    /// From the stored columns; `None` while the key is unfinished (no status yet).
    fn from_columns(
        status: Option<i64>,
        content_type: Option<String>,
        body: Option<Vec<u8>>,
    ) -> Result<Option<Saved>, StoreError> {
        let Some(status) = status else {
            return Ok(None);
        };
        Ok(Some(Saved {
            status: u16::try_from(status)
                .map_err(|_| StoreError::Corrupt(format!("saved status {status}")))?,
            content_type: content_type.unwrap_or_default(),
            body: body.unwrap_or_default(),
        }))
    }
}

/// What `begin` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Begin {
    /// The key is ours to work on: new, or taken over from a lapsed lease.
    Owner(Lease),
    /// The key finished earlier; here is its answer.
    Replay(Saved),
    /// Another request with this key is running; its lease ends in this long.
    InFlight { retry_after: Duration },
    /// The key was first used for another request.
    Mismatch,
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

/// The statements each database provides; [`begin`] composes them.
pub trait RecordStore: Send + Sync {
    /// Inserts a fresh record with fence 1, unless the key exists. The fence, if inserted.
    fn insert(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;

    fn read(
        &self,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Deletes the record if it has expired.
    fn forget_expired(
        &self,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes over an unfinished record whose lease lapsed, if its fence is still `fence`:
    /// the new fence, or `None` when someone else got there first.
    fn take_over(
        &self,
        scope: &str,
        key: &str,
        fence: i64,
        lease: Duration,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;

    /// Extends the lease; false when it is no longer ours.
    fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Saves the answer; false when the lease is no longer ours (nothing is written).
    fn complete(
        &self,
        lease: &Lease,
        saved: &Saved,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Ends the lease now without an answer, so the next request runs the operation again.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes expired records; how many.
    fn sweep(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// The records of whichever database the service uses.
#[derive(Clone, Debug)]
pub enum Records {
    Postgres(PgRecords),
    Sqlite(SqliteRecords),
}

impl Records {
    pub fn new(db: &Database) -> Records {
        match db {
            Database::Postgres(pool) => Records::Postgres(PgRecords::new(pool.clone())),
            Database::Sqlite(sqlite) => Records::Sqlite(SqliteRecords::new(sqlite.pool())),
        }
    }
}

macro_rules! delegate {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            Records::Postgres($store) => $call.await,
            Records::Sqlite($store) => $call.await,
        }
    };
}

impl RecordStore for Records {
    async fn insert(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Option<i64>, StoreError> {
        delegate!(self, s => s.insert(scope, key, fingerprint, lease, ttl))
    }

    async fn read(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        delegate!(self, s => s.read(scope, key))
    }

    async fn forget_expired(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        delegate!(self, s => s.forget_expired(scope, key))
    }

    async fn take_over(
        &self,
        scope: &str,
        key: &str,
        fence: i64,
        lease: Duration,
    ) -> Result<Option<i64>, StoreError> {
        delegate!(self, s => s.take_over(scope, key, fence, lease))
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<bool, StoreError> {
        delegate!(self, s => s.renew(lease, lease_for))
    }

    async fn complete(&self, lease: &Lease, saved: &Saved) -> Result<bool, StoreError> {
        delegate!(self, s => s.complete(lease, saved))
    }

    async fn release(&self, lease: &Lease) -> Result<bool, StoreError> {
        delegate!(self, s => s.release(lease))
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        delegate!(self, s => s.sweep())
    }
}

/// Claims `key` for this request, or says why not.
pub async fn begin(
    store: &impl RecordStore,
    scope: &str,
    key: &str,
    fingerprint: &Fingerprint,
    lease: Duration,
    ttl: Duration,
) -> Result<Begin, StoreError> {
    // Each turn either decides or loses a race that moved the record on; a handful of
    // turns is more than any real contention needs.
    for _ in 0..8 {
        if let Some(fence) = store.insert(scope, key, fingerprint, lease, ttl).await? {
            return Ok(Begin::Owner(lease_of(scope, key, fence)));
        }
        let Some(record) = store.read(scope, key).await? else {
            continue; // swept between our insert and our read
        };
        if record.expired {
            store.forget_expired(scope, key).await?;
            continue;
        }
        if record.fingerprint != fingerprint.as_str() {
            return Ok(Begin::Mismatch);
        }
        if let Some(saved) = record.saved {
            return Ok(Begin::Replay(saved));
        }
        if !record.lease_left.is_zero() {
            return Ok(Begin::InFlight {
                retry_after: record.lease_left,
            });
        }
        if let Some(fence) = store.take_over(scope, key, record.fence, lease).await? {
            tracing::warn!(
                key,
                fence,
                "took over an Idempotency-Key whose lease had lapsed"
            );
            return Ok(Begin::Owner(lease_of(scope, key, fence)));
        }
    }
    Ok(Begin::InFlight {
        retry_after: Duration::from_secs(1),
    })
}

fn lease_of(scope: &str, key: &str, fence: i64) -> Lease {
    Lease {
        scope: scope.to_owned(),
        key: key.to_owned(),
        fence,
    }
}

/// Deletes expired records every `every`, for as long as the service runs.
pub async fn sweep_forever(store: Records, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match store.sweep().await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(removed = n, "swept expired Idempotency-Keys"),
            Err(err) => tracing::warn!(error = %err, "cannot sweep expired Idempotency-Keys"),
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
