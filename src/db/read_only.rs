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

/// The process's mark.
static MARK: Mark = Mark::new();

/// Starts the clock; called before a pool opens its first connection, so that no
/// connection is older than [`EPOCH`].
pub(super) fn start_clock() {
    LazyLock::force(&EPOCH);
}

/// A statement was refused because the server is read-only.
pub(super) fn seen() {
    MARK.seen_at(EPOCH.elapsed());
}

/// Whether a connection of this age was opened before the last 25006 was seen (then the
/// pool closes it instead of lending it or taking it back).
pub(super) fn opened_before_seen(age: Duration) -> bool {
    MARK.opened_before(age, EPOCH.elapsed())
}

/// When the last 25006 was seen, as nanoseconds from [`EPOCH`] plus one; 0 when none was.
struct Mark(AtomicU64);

impl Mark {
    const fn new() -> Mark {
        Mark(AtomicU64::new(0))
    }

    fn seen_at(&self, now: Duration) {
        self.0
            .fetch_max(nanos(now).saturating_add(1), Ordering::SeqCst);
    }

    /// Whether a connection `age` old at `now` was opened before the mark.
    fn opened_before(&self, age: Duration, now: Duration) -> bool {
        let seen = self.0.load(Ordering::SeqCst);
        seen != 0 && nanos(now.saturating_sub(age)) < seen
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    // Seen failing with `seen_at` emptied: the connection opened before the refusal was
    // still lent ("assertion failed: mark.opened_before(ms(20), ms(110))").
    #[test]
    fn connections_opened_before_a_read_only_refusal_are_let_go_and_later_ones_kept() {
        let mark = Mark::new();
        // No refusal yet: every connection is kept.
        assert!(!mark.opened_before(ms(50), ms(100)));
        mark.seen_at(ms(100));
        // At 110 ms: opened at 90 ms (before the refusal), at 100 ms (with it), at 105 ms.
        assert!(mark.opened_before(ms(20), ms(110)));
        assert!(mark.opened_before(ms(10), ms(110)));
        assert!(!mark.opened_before(ms(5), ms(110)));
        // An earlier refusal reported late does not move the mark back.
        mark.seen_at(ms(60));
        assert!(!mark.opened_before(ms(5), ms(110)));
        assert!(mark.opened_before(ms(20), ms(110)));
    }
}
