//! Counts and times each payment-provider request (each retry its own), timeouts
//! included. Sits between the provider retry and the provider timeout.

use std::time::Instant;

use tower::{BoxError, Service, ServiceExt, service_fn};

use super::wire::{Call, ProviderResponse};
use crate::metrics::Metrics;

pub(super) fn observe<S>(
    inner: S,
    metrics: Metrics,
) -> impl Service<Call, Response = ProviderResponse, Error = BoxError, Future: Send> + Clone + Send + Sync
where
    S: Service<Call, Response = ProviderResponse, Error = BoxError> + Clone + Send + Sync + 'static,
    S::Future: Send,
{
    service_fn(move |call: Call| {
        let (inner, metrics) = (inner.clone(), metrics.clone());
        async move {
            let operation = call.operation();
            let started = Instant::now();
            let result = inner.oneshot(call).await;
            let outcome = match &result {
                Ok(response) => response.outcome(),
                Err(err) if err.is::<tower::timeout::error::Elapsed>() => "timeout",
                Err(_) => "transport",
            };
            metrics.provider_request(operation, outcome, started.elapsed());
            result
        }
    })
}
