//! The loop retry: repeats the whole assistant loop, tools and all.
//!
//! This is the `@Retry` of the article, and here it is safe: every attempt is a clone of
//! the same [`LoopRequest`], so it charges with the key the handler made, and the
//! gateway returns the earlier attempt's receipt instead of charging again.

use std::time::Duration;

use tower::BoxError;
use tower::retry::Policy;
use tower::retry::backoff::{Backoff, ExponentialBackoff};
use tower::util::rng::HasherRng;

use super::agent::CheckoutOutcome;
use super::context::LoopRequest;
use super::error::{CheckoutError, FailureKind, LoopStop};
use crate::backoff::jittered_backoff;

#[derive(Clone, Debug)]
pub struct LoopRetrySettings {
    pub max_retries: u32,
    pub timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

#[derive(Clone)]
pub struct LoopRetry {
    max_retries: u32,
    timeout: Duration,
    backoff: ExponentialBackoff<HasherRng>,
}

impl LoopRetry {
    pub fn new(settings: &LoopRetrySettings) -> Self {
        LoopRetry {
            max_retries: settings.max_retries,
            timeout: settings.timeout,
            backoff: jittered_backoff(settings.backoff_min, settings.backoff_max),
        }
    }
}

impl Policy<LoopRequest, CheckoutOutcome, BoxError> for LoopRetry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        request: &mut LoopRequest,
        result: &mut Result<CheckoutOutcome, BoxError>,
    ) -> Option<Self::Future> {
        let err = result.as_mut().err()?;
        if !err.is::<CheckoutError>() {
            let kind = if err.is::<tower::timeout::error::Elapsed>() {
                FailureKind::Timeout(self.timeout)
            } else {
                unreachable!("the loop fails only with CheckoutError or the loop timeout: {err}")
            };
            *err = Box::new(CheckoutError::new(kind, request.attempt));
        }
        let failure = err
            .downcast_mut::<CheckoutError>()
            .expect("the error was just made a CheckoutError");
        failure.attempts = request.attempt;
        if !failure.kind.is_retryable() {
            failure.stop = Some(LoopStop::NotRetryable);
            return None;
        }
        if self.max_retries == 0 {
            failure.stop = Some(LoopStop::Off);
            return None;
        }
        if request.attempt > self.max_retries {
            failure.stop = Some(LoopStop::RetriesSpent);
            return None;
        }
        request.attempt += 1;
        tracing::warn!(
            order = %request.ctx.order().id(),
            attempt = request.attempt,
            of = self.max_retries + 1,
            error = %failure.kind,
            "loop retry: running the whole assistant loop again; its charge is keyed by the order id, so a charge made by an earlier attempt is found, not repeated"
        );
        Some(self.backoff.next_backoff())
    }

    fn clone_request(&mut self, request: &LoopRequest) -> Option<LoopRequest> {
        Some(request.clone())
    }
}
