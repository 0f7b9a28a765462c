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
use super::error::CheckoutError;
use crate::metrics::{Metrics, RetryLayer, TimedOut};
use crate::retry::{Stop, jittered_backoff};

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
    /// The loop journals its steps: a retry resumes it rather than starting it over.
    resumes: bool,
    timeout: Duration,
    backoff: ExponentialBackoff<HasherRng>,
    metrics: Metrics,
}

impl LoopRetry {
    pub fn new(settings: &LoopRetrySettings, resumes: bool, metrics: &Metrics) -> Self {
        LoopRetry {
            max_retries: settings.max_retries,
            resumes,
            timeout: settings.timeout,
            backoff: jittered_backoff(settings.backoff_min, settings.backoff_max),
            metrics: metrics.clone(),
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
        if err.is::<tower::timeout::error::Elapsed>() {
            self.metrics.timeout(TimedOut::Loop);
        }
        let failure = CheckoutError::adopt(err, self.timeout, request.attempt);
        if !failure.kind.is_retryable() {
            failure.stop = Some(Stop::NotRetryable);
            return None;
        }
        if self.max_retries == 0 {
            failure.stop = Some(Stop::Off);
            return None;
        }
        if request.attempt > self.max_retries {
            failure.stop = Some(Stop::RetriesSpent);
            return None;
        }
        request.attempt += 1;
        self.metrics.retry(RetryLayer::Loop, failure.kind.reason());
        if self.resumes {
            tracing::warn!(
                order = %request.ctx.order().id(),
                attempt = request.attempt,
                of = self.max_retries + 1,
                error = %failure.kind,
                "loop retry: resuming the assistant loop from its journal; the steps that ended are replayed, not asked or run again"
            );
        } else {
            tracing::warn!(
                order = %request.ctx.order().id(),
                attempt = request.attempt,
                of = self.max_retries + 1,
                error = %failure.kind,
                "loop retry: running the whole assistant loop again; its charge is keyed by the order id, so a charge made by an earlier attempt is found, not repeated"
            );
        }
        Some(self.backoff.next_backoff())
    }

    fn clone_request(&mut self, request: &LoopRequest) -> Option<LoopRequest> {
        Some(request.clone())
    }
}
