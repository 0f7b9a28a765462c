//! What the two retry layers (one model request; the whole assistant loop) share: the
//! failure they hand on, how they take over the error a timeout layer boxed, and their
//! jittered backoff. Depends on nothing else in the crate, so both layers can use it.

use std::fmt;
use std::time::Duration;

use tower::BoxError;
use tower::retry::backoff::{ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff};
use tower::util::rng::HasherRng;

/// What a retry layer repeats, named as its answers and log lines name it.
pub trait Unit: std::error::Error + Send + Sync + Sized + 'static {
    /// The layer: `request retry`, `loop retry`.
    const LAYER: &'static str;
    /// One try of the unit: `request`, `loop attempt`.
    const TRY: &'static str;

    /// The failure when the timeout under the retry layer cut a try off.
    fn timed_out(after: Duration) -> Self;

    /// A boxed error that is neither ours nor the timeout's.
    fn foreign(err: &BoxError) -> Self;
}

/// A failure after a retry layer had its say: what failed, how many tries it took, and
/// why the layer stopped repeating it.
#[derive(Debug)]
pub struct Retried<K> {
    pub kind: K,
    /// Tries made, the failed one included.
    pub attempts: u32,
    /// Why the retry layer stopped (unset until the layer has seen the failure).
    pub stop: Option<Stop>,
}

/// Why a retry layer stopped repeating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The failure is not one a repeat can mend (a 4xx such as a bad API key).
    NotRetryable,
    /// Every allowed retry was used.
    RetriesSpent,
    /// The retry budget shared by all requests is empty: the provider is failing broadly.
    BudgetSpent,
    /// The provider asked to wait longer than we are allowed to.
    RetryAfterTooLong(Duration),
    /// The layer is configured with no retries.
    Off,
    /// Another endpoint is next in line for the same request: it is asked instead of
    /// this one again (a dead primary does not cost every turn its backoff).
    FailOver,
}

impl<K: Unit> Retried<K> {
    pub fn new(kind: K) -> Self {
        Retried {
            kind,
            attempts: 1,
            stop: None,
        }
    }

    /// Under `.retry(p).timeout(d)` the policy sees a boxed error: ours, or the timeout's
    /// `Elapsed`. Makes it ours either way, with the tries counted so far, so the caller
    /// always gets a `Retried<K>`.
    pub fn adopt(err: &mut BoxError, timeout: Duration, attempts: u32) -> &mut Retried<K> {
        if !err.is::<Retried<K>>() {
            let kind = if err.is::<tower::timeout::error::Elapsed>() {
                K::timed_out(timeout)
            } else {
                K::foreign(err)
            };
            *err = Box::new(Retried::new(kind));
        }
        let ours = err
            .downcast_mut::<Retried<K>>()
            .expect("the error was just made ours");
        ours.attempts = attempts;
        ours
    }
}

impl<K: Unit> fmt::Display for Retried<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        let (layer, tries) = (K::LAYER, self.attempts);
        let unit = format!("{tries} {}{}", K::TRY, if tries == 1 { "" } else { "s" });
        match self.stop {
            None => Ok(()),
            Some(Stop::NotRetryable) => {
                write!(f, "; the {layer} does not repeat this failure ({unit})")
            }
            Some(Stop::RetriesSpent) => write!(f, "; the {layer} gave up after {unit}"),
            Some(Stop::BudgetSpent) => write!(
                f,
                "; the {layer} gave up after {unit}: the retry budget is spent"
            ),
            Some(Stop::RetryAfterTooLong(wait)) => write!(
                f,
                "; the {layer} gave up after {unit}: Retry-After asked for {} ms, beyond the cap",
                wait.as_millis()
            ),
            Some(Stop::Off) => write!(f, "; the {layer} is off"),
            Some(Stop::FailOver) => {
                write!(f, "; the {layer} left it to the next endpoint ({unit})")
            }
        }
    }
}

impl<K: Unit> std::error::Error for Retried<K> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.kind.source()
    }
}

/// Exponential backoff from `min`, doubling up to `max`, each wait plus up to 100 % jitter
/// (capped at `max`), so that retries of many requests do not arrive in step.
pub fn jittered_backoff(min: Duration, max: Duration) -> ExponentialBackoff<HasherRng> {
    ExponentialBackoffMaker::new(min, max.max(min), 1.0, HasherRng::default())
        .expect("backoff bounds are checked when the settings are loaded")
        .make_backoff()
}
