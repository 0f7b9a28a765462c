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

mod records;
mod renewals;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Semaphore;

pub use records::{Lapsed, Lease, PAUSE, PAUSED, REOPEN, SETTLE_PAUSED, Saved};

use records::{Completion, Completions, Inserts, NewRecord};
use renewals::{Renewal, Renewals};

use crate::db::{Database, GroupWriter, StoreError};
use crate::journal::wake::Wake;
use crate::journal::{self, NewEntry};
use crate::outbox;

/// What makes two requests the same request (`canonical`: method, path and what the
/// request asks, as text), and the request itself, which the record keeps so that an
/// approval's resume or the recovery sweep can run the operation again without its
/// client. Both are made by the request's own type (`http::Operation`): the records
/// compare and keep them, and read neither.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    canonical: String,
    request: String,
}

impl Fingerprint {
    pub fn new(canonical: String, request: String) -> Fingerprint {
        Fingerprint { canonical, request }
    }

    pub fn as_str(&self) -> &str {
        &self.canonical
    }

    /// The request, as its record keeps it.
    pub fn request(&self) -> &str {
        &self.request
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

/// The records of the service's database. A new key's insert and a saved answer, which
/// every keyed checkout makes, go with the next group of their kind (one statement and
/// one commit for all that arrive together, `db::GroupWriter`), and on SQLite a lease's
/// renewal too (`renewals`); every other call takes a connection for its statements.
#[derive(Clone, Debug)]
pub struct Records {
    db: Database,
    inserts: GroupWriter<Inserts>,
    completions: GroupWriter<Completions>,
    renewals: GroupWriter<Renewals>,
    /// Postgres's renewals that may wait for a connection at once: twice the pool. Each
    /// waits in sqlx's acquire, a large future, and a thousand renewals wait on a pool of
    /// 16 at once (bench figure 12 under heaptrack), where one waiting for its turn here
    /// holds a few words.
    renewal_turns: Arc<Semaphore>,
}

impl Records {
    /// Starts the group writers' tasks: call within the runtime. `wake`: the streams to
    /// tell when an operation completes.
    pub fn new(db: &Database, wake: &Arc<Wake>) -> Records {
        Records {
            db: db.clone(),
            inserts: GroupWriter::start(db, Inserts),
            completions: GroupWriter::start(db, Completions(wake.clone())),
            renewals: GroupWriter::start(db, Renewals),
            renewal_turns: Arc::new(Semaphore::new(2 * db.max_connections() as usize)),
        }
    }

    /// Extends the lease; false when it is no longer ours.
    ///
    /// Each store's renewal is a box of its own size: as one `async fn`, every renewal
    /// was as large as Postgres's (a pool's acquire and a statement), SQLite's too, which
    /// only queues a row for its group writer; and a thousand renewals wait at once when
    /// the operations that began together renew together (bench figure 12 under
    /// heaptrack). On Postgres a renewal waits for its
    /// turn (`renewal_turns`) before it asks the pool, and the acquire and the statement
    /// are boxes of their own.
    pub fn renew<'a>(
        &'a self,
        lease: &Lease,
        lease_for: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let renewal = Renewal::new(lease, lease_for);
        match self.db.kind() {
            "sqlite" => Box::pin(self.renewals.write(renewal)),
            _ => Box::pin(async move {
                let _turn = self.renewal_turns.acquire().await.expect("never closed");
                let mut conn = Box::pin(self.db.acquire()).await?;
                Box::pin(renewals::renew(conn.conn(), &renewal)).await
            }),
        }
    }

    /// Saves the answer, and in the same commit the operation's `closing` journal steps;
    /// false when the lease is no longer ours (nothing is written).
    pub async fn complete(
        &self,
        lease: &Lease,
        saved: &Saved,
        closing: Vec<NewEntry>,
    ) -> Result<bool, StoreError> {
        self.completions
            .write(Completion {
                lease: lease.clone(),
                saved: saved.clone(),
                closing,
            })
            .await
    }

    /// Ends the lease now without an answer, so the next request runs the operation again.
    pub async fn release(&self, lease: &Lease) -> Result<bool, StoreError> {
        records::release(self.db.acquire().await?.conn(), lease).await
    }

    /// The request the record of `caller`'s `key` keeps, if there is one.
    pub async fn request(&self, caller: &str, key: &str) -> Result<Option<String>, StoreError> {
        records::request(self.db.acquire().await?.conn(), caller, key).await
    }

    /// The record of `caller`'s `key` as it stands: its saved answer, or how long its
    /// lease runs (zero: lapsed); `None` when there is none (or it expired).
    pub async fn status(
        &self,
        caller: &str,
        key: &str,
    ) -> Result<Option<Result<Saved, Duration>>, StoreError> {
        let record = records::read(self.db.acquire().await?.conn(), caller, key).await?;
        Ok(record
            .filter(|r| !r.expired)
            .map(|r| r.saved.ok_or(r.lease_left)))
    }

    /// Takes over `caller`'s `key` when its lease lapsed unfinished (a decider whose
    /// instance died): as a client's retry would.
    pub async fn take_lapsed(
        &self,
        caller: &str,
        key: &str,
        lease: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let mut conn = self.db.acquire().await?;
        let Some(record) = records::read(conn.conn(), caller, key).await? else {
            return Ok(None);
        };
        if record.saved.is_some() || !record.lease_left.is_zero() {
            return Ok(None);
        }
        let fence = records::take_over(conn.conn(), caller, key, record.fence, lease).await?;
        Ok(fence.map(|fence| lease_of(caller, key, fence)))
    }

    /// Unfinished operations whose lease lapsed at least `grace` ago (the sweep's).
    pub async fn lapsed(&self, grace: Duration) -> Result<Vec<Lapsed>, StoreError> {
        records::lapsed(self.db.acquire().await?.conn(), grace).await
    }

    /// Takes a lapsed operation over for the recovery sweep, while it has fewer than
    /// `max` recoveries: a new fence, as a client's retry would take.
    pub async fn recover(
        &self,
        lapsed: &Lapsed,
        lease: Duration,
        max: i64,
    ) -> Result<Option<Lease>, StoreError> {
        records::recover(self.db.acquire().await?.conn(), lapsed, lease, max).await
    }

    /// Marks an operation recovered `max` times as needing attention; true if this call did.
    pub async fn give_up(&self, lapsed: &Lapsed, max: i64) -> Result<bool, StoreError> {
        records::give_up(self.db.acquire().await?.conn(), lapsed, max).await
    }

    /// Deletes expired records, expired journal entries (they expire with their
    /// operation's record) and the outbox rows whose delivery ended longer than `ttl`
    /// ago; how many records.
    pub async fn sweep(&self, ttl: Duration) -> Result<u64, StoreError> {
        let mut conn = self.db.acquire().await?;
        journal::sweep(conn.conn()).await?;
        outbox::sweep(conn.conn(), ttl).await?;
        records::sweep(conn.conn()).await
    }
}

/// Claims `key` for this request, or says why not.
pub async fn begin(
    store: &Records,
    caller: &str,
    key: &str,
    fingerprint: &Fingerprint,
    lease: Duration,
    ttl: Duration,
) -> Result<Begin, StoreError> {
    // A new key, the common case, goes in with the next group of new keys.
    let new = NewRecord {
        caller: caller.to_owned(),
        key: key.to_owned(),
        fingerprint: fingerprint.as_str().to_owned(),
        request: fingerprint.request().to_owned(),
        lease,
        ttl,
    };
    if let Some(fence) = store.inserts.write(new).await? {
        return Ok(Begin::Owner(lease_of(caller, key, fence)));
    }
    // Boxed: a key with a record is the rare case, and its future (a connection's acquire
    // and the record's statements) is large, which every claim waiting for its group held
    // inline: when 10,000 streamed checkouts claim their keys at once, their claims queue
    // on the group writer (bench figure 12 under heaptrack).
    Box::pin(begin_existing(store, caller, key, fingerprint, lease, ttl)).await
}

/// [`begin`] for a key whose insert found a record: decided against the record, or the
/// key taken over, or claimed again once the record is gone.
async fn begin_existing(
    store: &Records,
    caller: &str,
    key: &str,
    fingerprint: &Fingerprint,
    lease: Duration,
    ttl: Duration,
) -> Result<Begin, StoreError> {
    let mut conn = store.db.acquire().await?;
    // Each turn either decides or loses a race that moved the record on; a handful of
    // turns is more than any real contention needs.
    for turn in 0..8 {
        if turn > 0 {
            let (fp, request) = (fingerprint.as_str(), fingerprint.request());
            if let Some(fence) =
                records::insert(conn.conn(), caller, key, fp, request, lease, ttl).await?
            {
                return Ok(Begin::Owner(lease_of(caller, key, fence)));
            }
        }
        let Some(record) = records::read(conn.conn(), caller, key).await? else {
            continue; // swept between our insert and our read
        };
        if record.expired {
            // The operation's journal goes first: a new operation under this key must
            // not resume the old one's.
            journal::forget(conn.conn(), caller, key).await?;
            records::forget_expired(conn.conn(), caller, key).await?;
            continue;
        }
        let fence = record.fence;
        if let Some(found) = settled(record, fingerprint) {
            return Ok(found);
        }
        if let Some(fence) = records::take_over(conn.conn(), caller, key, fence, lease).await? {
            tracing::warn!(
                key,
                fence,
                "took over an Idempotency-Key whose lease had lapsed"
            );
            return Ok(Begin::Owner(lease_of(caller, key, fence)));
        }
    }
    Ok(Begin::InFlight {
        retry_after: Duration::from_secs(1),
    })
}

/// What `begin` would answer without running the work, found without writing anything;
/// `None` when `begin` would claim the key (no record, an expired one, a lapsed lease).
/// Asked when the instance is full: a finished answer is still replayed then.
pub async fn peek(
    store: &Records,
    caller: &str,
    key: &str,
    fingerprint: &Fingerprint,
) -> Result<Option<Begin>, StoreError> {
    let mut conn = store.db.acquire().await?;
    Ok(match records::read(conn.conn(), caller, key).await? {
        Some(record) if !record.expired => settled(record, fingerprint),
        _ => None,
    })
}

/// What a live record tells a request with `fingerprint`; `None` when its lease lapsed
/// unfinished, so the request may take the key over.
fn settled(record: records::Record, fingerprint: &Fingerprint) -> Option<Begin> {
    if record.fingerprint != fingerprint.as_str() {
        return Some(Begin::Mismatch);
    }
    if let Some(saved) = record.saved {
        return Some(Begin::Replay(saved));
    }
    if !record.lease_left.is_zero() {
        return Some(Begin::InFlight {
            retry_after: record.lease_left,
        });
    }
    None
}

pub(crate) fn lease_of(caller: &str, key: &str, fence: i64) -> Lease {
    Lease {
        caller: caller.to_owned(),
        key: key.to_owned(),
        fence,
    }
}
