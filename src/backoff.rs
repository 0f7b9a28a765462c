//! The backoff shared by the retry layers (the loop retry and the request retry).

use std::time::Duration;

use tower::retry::backoff::{ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff};
use tower::util::rng::HasherRng;

/// Exponential backoff from `min`, doubling up to `max`, each wait plus up to 100 % jitter
/// (capped at `max`), so that retries of many requests do not arrive in step.
pub fn jittered_backoff(min: Duration, max: Duration) -> ExponentialBackoff<HasherRng> {
    ExponentialBackoffMaker::new(min, max.max(min), 1.0, HasherRng::default())
        .expect("backoff bounds are checked when the settings are loaded")
        .make_backoff()
}
