//! The provider retry: the same request again, with the same Idempotency-Key and form.

use tower::BoxError;
use tower::retry::Policy;
use tower::retry::backoff::{Backoff, ExponentialBackoff};
use tower::util::rng::HasherRng;

use super::wire::{Call, ProviderResponse};
use crate::metrics::{Metrics, RetryLayer};

/// Repeats one provider request, with the same key and form: on a timeout, a failed or
/// dropped connection, 409 `idempotency_key_in_use`, 429 and 5xx. Never on another 4xx
/// (402 is an answer; 400 `idempotency_error` is a bug, not a blip).
#[derive(Clone)]
pub(super) struct ProviderRetry {
    max_retries: u32,
    backoff: ExponentialBackoff<HasherRng>,
    attempts: u32,
    metrics: Metrics,
}

impl ProviderRetry {
    pub(super) fn new(
        max_retries: u32,
        backoff: ExponentialBackoff<HasherRng>,
        metrics: &Metrics,
    ) -> ProviderRetry {
        ProviderRetry {
            max_retries,
            backoff,
            attempts: 0,
            metrics: metrics.clone(),
        }
    }
}

impl Policy<Call, ProviderResponse, BoxError> for ProviderRetry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _call: &mut Call,
        result: &mut Result<ProviderResponse, BoxError>,
    ) -> Option<Self::Future> {
        let reason = match result {
            Ok(response) if response.status == 409 => "in_use",
            Ok(response) if response.status == 429 => "rate_limited",
            Ok(response) if response.status >= 500 => "server_error",
            Ok(_) => return None,
            Err(err) if err.is::<tower::timeout::error::Elapsed>() => "timeout",
            Err(_) => "transport",
        };
        self.attempts += 1;
        if self.attempts > self.max_retries {
            return None;
        }
        self.metrics.retry(RetryLayer::Provider, reason);
        tracing::info!(
            attempt = self.attempts + 1,
            reason,
            "provider retry: re-sending one payment-provider request with the same Idempotency-Key"
        );
        Some(self.backoff.next_backoff())
    }

    fn clone_request(&mut self, call: &Call) -> Option<Call> {
        Some(call.clone())
    }
}
