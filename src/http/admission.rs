//! Admission: a bound on the checkout loops running at once in this instance (a bulkhead
//! that refuses instead of queueing). One more is answered 503 `overloaded` at once,
//! before anything is written, so its Idempotency-Key stays usable; a loop once admitted
//! runs to its end, because shedding a loop that already charged would turn a paid order
//! into an error.
//!
//! Only work that runs a loop takes a slot: a client's checkout whose key has no finished
//! answer, and the recovery sweep's resumes. Replays, receipts, health and metrics never
//! ask.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::{Code, Problem};
use crate::metrics::Metrics;

/// Weight of the newest loop in the running mean of loop durations, as 1/N: the mean
/// follows a change in the model's speed within a few dozen loops.
const MEAN_WEIGHT: u64 = 16;

/// The admission bound of one instance. Cloning is cheap; clones share the bound.
#[derive(Clone, Debug)]
pub struct Admission(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    limit: usize,
    slots: Arc<Semaphore>,
    /// Running mean of how long an admitted loop held its slot, in ms (0: none yet).
    mean_ms: AtomicU64,
    metrics: Metrics,
}

/// One admitted loop's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    admission: Admission,
    started: Instant,
    /// False for a slot given back without running a loop: it says nothing about how
    /// fast loops finish.
    ran: bool,
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    pub fn new(limit: usize, metrics: &Metrics) -> Admission {
        let admission = Admission(Arc::new(Inner {
            limit,
            slots: Arc::new(Semaphore::new(limit)),
            mean_ms: AtomicU64::new(0),
            metrics: metrics.clone(),
        }));
        admission.0.metrics.in_flight_limit(limit);
        admission
    }

    pub fn limit(&self) -> usize {
        self.0.limit
    }

    /// Loops running now.
    pub fn in_flight(&self) -> usize {
        self.0.limit - self.0.slots.available_permits()
    }

    /// A slot for one loop, or none when the instance is full. Never waits.
    pub fn try_admit(&self) -> Option<Slot> {
        let permit = self.0.slots.clone().try_acquire_owned().ok()?;
        self.0.metrics.in_flight(1);
        Some(Slot {
            admission: self.clone(),
            started: Instant::now(),
            ran: true,
            _permit: permit,
        })
    }

    /// The answer to a checkout that found the instance full, counted.
    pub fn refusal(&self) -> Problem {
        self.0.metrics.refused(Code::Overloaded.as_str());
        let retry_after = self.retry_after();
        Problem::new(
            Code::Overloaded,
            format!(
                "this instance is running its limit of {} checkouts at once (CHECKOUT_MAX_IN_FLIGHT); nothing was run or recorded, so the same request (with the same Idempotency-Key) can be sent again after {retry_after} s",
                self.0.limit
            ),
        )
        .retry_after(retry_after)
    }

    /// How long a refused client should wait: about as long as a loop now takes, the time
    /// in which every running loop has given its slot back once. At least 1 s; 1 s until
    /// a loop has finished.
    pub fn retry_after(&self) -> u64 {
        let mean = Duration::from_millis(self.0.mean_ms.load(Ordering::Relaxed));
        mean.as_millis().div_ceil(1000).max(1) as u64
    }

    fn finished(&self, took: Duration) {
        let took = took.as_millis() as u64;
        // A lost update between two loops finishing at once costs one sample of a mean.
        let mean = self.0.mean_ms.load(Ordering::Relaxed);
        let next = if mean == 0 {
            took
        } else {
            mean - mean / MEAN_WEIGHT + took / MEAN_WEIGHT
        };
        self.0.mean_ms.store(next.max(1), Ordering::Relaxed);
    }
}

impl Slot {
    /// Gives the slot back without having run a loop (the key had an answer already, or
    /// another holder).
    pub fn unused(mut self) {
        self.ran = false;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.ran {
            self.admission.finished(self.started.elapsed());
        }
        self.admission.0.metrics.in_flight(-1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_holds_and_a_slot_comes_back_when_dropped() {
        let admission = Admission::new(2, &Metrics::new());
        let a = admission.try_admit().expect("a slot");
        let b = admission.try_admit().expect("a slot");
        assert!(admission.try_admit().is_none());
        assert_eq!(admission.in_flight(), 2);
        drop(a);
        assert_eq!(admission.in_flight(), 1);
        b.unused();
        assert_eq!(admission.in_flight(), 0);
    }

    #[test]
    fn retry_after_follows_how_long_loops_take_and_is_at_least_one_second() {
        let admission = Admission::new(1, &Metrics::new());
        assert_eq!(admission.retry_after(), 1);
        admission.finished(Duration::from_millis(4_200));
        assert_eq!(admission.retry_after(), 5);
        admission.finished(Duration::from_millis(10));
        assert!(admission.retry_after() >= 4, "{}", admission.retry_after());
        let quick = Admission::new(1, &Metrics::new());
        quick.finished(Duration::from_millis(3));
        assert_eq!(quick.retry_after(), 1);
    }
}
