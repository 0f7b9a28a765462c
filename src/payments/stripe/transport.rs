//! The innermost service: one request to the payment provider, no retries of its own.

use std::sync::Arc;

use reqwest::header::{CONTENT_TYPE, HeaderMap};
use tower::{BoxError, Service, service_fn};

use super::wire::{Call, ProviderResponse, Request};
use crate::secret::Secret;
use crate::telemetry::genai;

/// Stripe's payment intents API: the HTTP client, the URLs of creating and searching an
/// intent, and the secret key.
pub(super) struct StripeApi {
    pub(super) http: reqwest::Client,
    pub(super) create: reqwest::Url,
    pub(super) search: reqwest::Url,
    pub(super) refunds: reqwest::Url,
    pub(super) api_key: Secret,
}

pub(super) fn transport(
    api: StripeApi,
) -> impl Service<Call, Response = ProviderResponse, Error = BoxError, Future: Send> + Clone + Send + Sync
{
    let api = Arc::new(api);
    service_fn(move |call: Call| {
        let api = api.clone();
        async move {
            let mut headers = HeaderMap::new();
            genai::inject_traceparent(&mut headers);
            let request = match call.request {
                Request::Create { key, form } => api
                    .http
                    .post(api.create.clone())
                    .header("Idempotency-Key", key.as_ref())
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(form),
                Request::Refund { key, form } => api
                    .http
                    .post(api.refunds.clone())
                    .header("Idempotency-Key", key.as_ref())
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(form),
                Request::ListRefunds { payment_intent } => {
                    let mut url = api.refunds.clone();
                    url.query_pairs_mut()
                        .append_pair("payment_intent", &payment_intent)
                        .append_pair("limit", "100");
                    api.http.get(url)
                }
                Request::Search { query } => {
                    let mut url = api.search.clone();
                    url.query_pairs_mut().append_pair("query", &query);
                    api.http.get(url)
                }
            };
            let response = request
                .headers(headers)
                .bearer_auth(api.api_key.expose())
                .send()
                .await?;
            let status = response.status().as_u16();
            let body = response.bytes().await?;
            Ok::<_, BoxError>(ProviderResponse { status, body })
        }
    })
}
