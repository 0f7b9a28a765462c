//! The request retry: repeats one chat-completions HTTP request, never the loop.
//!
//! Retrying here is always safe: a request to the model has no side effect of ours, and
//! the tool results it carries were computed once, before it was sent.

use std::sync::Arc;
use std::time::Duration;

use tower::BoxError;
use tower::retry::Policy;
use tower::retry::backoff::{Backoff, ExponentialBackoff};
use tower::retry::budget::{Budget, TpsBudget};
use tower::util::rng::HasherRng;

use super::call::ModelCall;
use super::error::{ModelError, ModelErrorKind, Stop};
use super::wire::ChatResponse;
use crate::metrics::{Metrics, RetryLayer};
use crate::retry::jittered_backoff;

/// The numbers of the request retry, from the settings.
#[derive(Clone, Debug)]
pub struct RequestRetrySettings {
    pub max_retries: u32,
    pub timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub retry_after_max: Duration,
    pub budget_percent: u32,
    pub budget_min_per_sec: u32,
}

/// A tower retry [`Policy`]. Each request gets its own clone (tower clones the policy per
/// call), so `attempts` and the backoff count one request; the budget is shared by all.
#[derive(Clone)]
pub struct RequestRetry {
    max_retries: u32,
    timeout: Duration,
    retry_after_max: Duration,
    backoff: ExponentialBackoff<HasherRng>,
    budget: Arc<TpsBudget>,
    attempts: u32,
    metrics: Metrics,
}

impl RequestRetry {
    pub fn new(settings: &RequestRetrySettings, metrics: &Metrics) -> Self {
        let backoff = jittered_backoff(settings.backoff_min, settings.backoff_max);
        RequestRetry {
            max_retries: settings.max_retries,
            timeout: settings.timeout,
            retry_after_max: settings.retry_after_max,
            backoff,
            budget: Arc::new(TpsBudget::new(
                Duration::from_secs(10),
                settings.budget_min_per_sec,
                settings.budget_percent as f32 / 100.0,
            )),
            attempts: 0,
            metrics: metrics.clone(),
        }
    }

    fn decide(&mut self, kind: &ModelErrorKind, failover: bool) -> Result<Duration, Stop> {
        if !kind.is_retryable() {
            return Err(Stop::NotRetryable);
        }
        if failover {
            return Err(Stop::FailOver);
        }
        if self.attempts > self.max_retries {
            return Err(Stop::RetriesSpent);
        }
        if let Some(wait) = kind
            .retry_after()
            .filter(|wait| *wait > self.retry_after_max)
        {
            return Err(Stop::RetryAfterTooLong(wait));
        }
        if !self.budget.withdraw() {
            return Err(Stop::BudgetSpent);
        }
        Ok(kind.retry_after().unwrap_or_default())
    }
}

impl Policy<ModelCall, ChatResponse, BoxError> for RequestRetry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        call: &mut ModelCall,
        result: &mut Result<ChatResponse, BoxError>,
    ) -> Option<Self::Future> {
        self.attempts += 1;
        if self.attempts == 1 {
            self.budget.deposit();
        }
        let err = result.as_mut().err()?;
        let model_err = ModelError::adopt(err, self.timeout, self.attempts);
        match self.decide(&model_err.kind, call.failover) {
            Ok(retry_after) => {
                self.metrics
                    .retry(RetryLayer::Request, model_err.kind.reason());
                call.attempt = self.attempts + 1;
                let backoff = self.backoff.next_backoff();
                if retry_after.is_zero() {
                    tracing::info!(round = call.round, attempt = call.attempt, error = %model_err.kind, "request retry: repeating one model request");
                    Some(backoff)
                } else {
                    tracing::info!(round = call.round, attempt = call.attempt, retry_after_ms = retry_after.as_millis() as u64, error = %model_err.kind, "request retry: repeating one model request after Retry-After");
                    Some(tokio::time::sleep(retry_after))
                }
            }
            Err(stop) => {
                if stop == Stop::BudgetSpent {
                    self.metrics.retry_budget_refused();
                }
                model_err.stop = Some(stop);
                None
            }
        }
    }

    fn clone_request(&mut self, call: &ModelCall) -> Option<ModelCall> {
        Some(call.clone())
    }
}
