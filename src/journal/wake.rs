//! Wake-ups for the streams of this process: when an operation's journal rows commit
//! here, the streams that follow that operation here are told at once, instead of each
//! reading the journal on a timer (docs/streaming.md, "How a stream follows the journal").
//!
//! A stream registers for its operation ([`Wake::follow`]), before the operation's task
//! starts; before each read of the journal it marks what it has seen ([`Follow::mark`]),
//! and after it waits for a commit since ([`Follow::changed`]), which returns at once if
//! one came during the read. Whoever commits journal rows of an operation (the journal's
//! group writer, the receipts' group insert that commits the charge's row, a refund's
//! transaction) calls [`Wake::committed`] after the commit. Only in-process: rows that
//! another instance commits wake nothing here, so a stream of an operation running
//! elsewhere still polls.
//!
//! Operations are told apart by a hash of (caller, operation key): no key is copied to
//! look one up, and two operations whose hashes collide only wake each other's streams
//! for nothing (a wake-up is a read of the journal, never an event of its own).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::NewEntry;

/// The registry of one service's streams (one per [`crate::App`], handed to every store
/// that commits journal rows).
#[derive(Debug, Default)]
pub struct Wake {
    /// A version per followed operation, bumped by each of its commits.
    followed: Mutex<HashMap<u64, Arc<Version>>>,
    /// How many streams follow anything: a commit with none to tell takes no lock.
    followers: AtomicUsize,
    hasher: std::hash::RandomState,
}

/// How many times a followed operation's rows committed, and its streams' wake-up. A
/// counter and a `Notify`, some 50 bytes: a `tokio::sync::watch` channel, which this
/// was, is some 300 (nine `Notify`s), one per waiting stream (bench figure 12).
#[derive(Debug, Default)]
struct Version {
    commits: AtomicU64,
    notify: Notify,
}

impl Wake {
    fn hash(&self, caller: &str, operation_key: &str) -> u64 {
        self.hasher.hash_one((caller, operation_key))
    }

    /// Registers a stream of `caller`'s operation `operation_key`, until the [`Follow`]
    /// is dropped.
    pub fn follow(self: &Arc<Self>, caller: &str, operation_key: &str) -> Follow {
        let id = self.hash(caller, operation_key);
        let version = self
            .followed
            .lock()
            .expect("the wake registry's lock")
            .entry(id)
            .or_default()
            .clone();
        self.followers.fetch_add(1, Ordering::Relaxed);
        // Registered, not yet marked: every commit from now on is news.
        let seen = version.commits.load(Ordering::Acquire);
        Follow {
            wake: self.clone(),
            id,
            version: Some(version),
            seen,
        }
    }

    /// Wakes the streams of the operations of `rows`, which have just committed.
    pub fn committed<'r>(&self, rows: impl IntoIterator<Item = &'r NewEntry>) {
        if self.followers.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut last = None;
        let followed = self.followed.lock().expect("the wake registry's lock");
        for row in rows {
            let id = self.hash(&row.key.caller, &row.key.operation_key);
            // An operation's rows come together: each is told once.
            if last.replace(id) == Some(id) {
                continue;
            }
            if let Some(version) = followed.get(&id) {
                version.commits.fetch_add(1, Ordering::Release);
                version.notify.notify_waiters();
            }
        }
    }
}

/// One stream's registration; dropping it unregisters.
#[derive(Debug)]
pub struct Follow {
    wake: Arc<Wake>,
    id: u64,
    /// The operation's version. Taken (and dropped) under the registry's lock, so that
    /// the last one out of an operation sees that it is the last.
    version: Option<Arc<Version>>,
    /// The version last marked as seen.
    seen: u64,
}

impl Follow {
    fn version(&self) -> &Version {
        self.version
            .as_ref()
            .expect("a Follow holds its version until dropped")
    }

    fn commits(&self) -> u64 {
        self.version().commits.load(Ordering::Acquire)
    }

    /// Marks every commit so far as seen: call it before reading the journal.
    pub fn mark(&mut self) {
        self.seen = self.commits();
    }

    /// Whether a row committed since the last [`Follow::mark`].
    pub fn has_changed(&mut self) -> bool {
        self.commits() != self.seen
    }

    /// Returns when a row commits after the last [`Follow::mark`]: at once if one has.
    pub async fn changed(&mut self) {
        let version = self.version();
        loop {
            // Listening before the count is read: a commit between the two wakes it.
            let notified = version.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if version.commits.load(Ordering::Acquire) != self.seen {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        let mut followed = self.wake.followed.lock().expect("the wake registry's lock");
        drop(self.version.take());
        if followed
            .get(&self.id)
            .is_some_and(|version| Arc::strong_count(version) == 1)
        {
            followed.remove(&self.id);
        }
        self.wake.followers.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{EntryKind, JournalKey};

    fn row(caller: &str, key: &str) -> NewEntry {
        NewEntry {
            key: JournalKey {
                caller: caller.into(),
                operation_key: key.into(),
                fence: None,
            },
            step: 1,
            kind: EntryKind::Answer,
            name: String::new(),
            call_id: None,
            body: String::new(),
            pins: None,
            input_tokens: None,
            output_tokens: None,
            ttl_ms: 1,
        }
    }

    #[tokio::test]
    async fn a_commit_wakes_the_streams_of_its_operation_only() {
        let wake = Arc::new(Wake::default());
        let mut a = wake.follow("ann", "k1");
        let mut a2 = wake.follow("ann", "k1");
        let mut b = wake.follow("ann", "k2");
        // Registered, not yet marked: a commit now is news all the same.
        wake.committed(&[row("ann", "k1"), row("ann", "k1")]);
        assert!(a.has_changed() && a2.has_changed() && !b.has_changed());
        a.changed().await;
        a.mark();
        assert!(!a.has_changed());
        assert!(futures_util::FutureExt::now_or_never(b.changed()).is_none());
        wake.committed(&[row("ann", "k2")]);
        b.changed().await;
        a2.changed().await;
        drop((a, a2, b));
        assert!(wake.followed.lock().unwrap().is_empty());
        assert_eq!(wake.followers.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn the_last_stream_out_unregisters_its_operation() {
        let wake = Arc::new(Wake::default());
        let a = wake.follow("ann", "k1");
        let a2 = wake.follow("ann", "k1");
        drop(a);
        assert_eq!(wake.followed.lock().unwrap().len(), 1);
        drop(a2);
        assert!(wake.followed.lock().unwrap().is_empty());
    }
}
