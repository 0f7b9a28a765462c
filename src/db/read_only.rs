//! A server that turned read-only under the pool's connections (SQLSTATE 25006: a primary
//! fenced or demoted, a standby reached by `target_session_attrs=any`) is a lost database,
//! and so is every connection opened before it was seen: they may all lead to that server.
//! The first 25006 marks the moment; the pool then lends no connection opened before it
//! and takes none of them back (`before_acquire`, `after_release` in `Database::open`),
//! so each is closed and a new connection walks `DATABASE_URL`'s hosts to the writable
//! server. Reads go with them: no request is served from the old server once it refused a
//! write. The check is a comparison of times, no round trip.
//!
//! The mark is the process's, not one pool's: `StoreError::from` sees the error, not the
//! pool it came from. A process with two pools (the specs') recycles both, which costs
//! reconnections and nothing else.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The times below are counted from here.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Nanoseconds from [`EPOCH`] to the last 25006 seen, plus one; 0 when none was.
static SEEN: AtomicU64 = AtomicU64::new(0);

/// Starts the clock; called before a pool opens its first connection, so that no
/// connection is older than [`EPOCH`].
pub(super) fn start_clock() {
    LazyLock::force(&EPOCH);
}

/// A statement was refused because the server is read-only.
pub(super) fn seen() {
    let now = nanos(EPOCH.elapsed()).saturating_add(1);
    SEEN.fetch_max(now, Ordering::SeqCst);
}

/// Whether a connection of this age was opened before the last 25006 was seen (then the
/// pool closes it instead of lending it or taking it back).
pub(super) fn opened_before_seen(age: Duration) -> bool {
    let seen = SEEN.load(Ordering::SeqCst);
    let opened = nanos(EPOCH.elapsed().saturating_sub(age));
    seen != 0 && opened < seen
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Seen failing with `seen()` emptied: the connection opened before the 25006 was
    // still lent.
    #[test]
    fn connections_opened_before_a_read_only_refusal_are_let_go_and_later_ones_kept() {
        start_clock();
        std::thread::sleep(Duration::from_millis(20));
        // Opened 10 ms ago, then the refusal.
        let opened = Instant::now() - Duration::from_millis(10);
        seen();
        std::thread::sleep(Duration::from_millis(5));
        assert!(opened_before_seen(opened.elapsed()));
        // Opened after it.
        let later = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(!opened_before_seen(later.elapsed()));
    }
}
