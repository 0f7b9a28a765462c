//! The innermost service: one request to the payment provider, no retries of its own.

use std::sync::Arc;

use reqwest::header::{CONTENT_TYPE, HeaderMap};
use tower::{BoxError, Service, service_fn};

use super::wire::{Call, Reply, Request};
use crate::secret::Secret;
use crate::telemetry::genai;

pub(super) struct Endpoint {
    pub(super) http: reqwest::Client,
    pub(super) create: reqwest::Url,
    pub(super) search: reqwest::Url,
    pub(super) refunds: reqwest::Url,
    pub(super) api_key: Secret,
}

pub(super) fn transport(
    endpoint: Endpoint,
) -> impl Service<Call, Response = Reply, Error = BoxError, Future: Send> + Clone + Send + Sync {
    let endpoint = Arc::new(endpoint);
    service_fn(move |call: Call| {
        let endpoint = endpoint.clone();
        async move {
            let mut headers = HeaderMap::new();
            genai::inject_traceparent(&mut headers);
            let request = match call.request {
                Request::Create { key, form } => endpoint
                    .http
                    .post(endpoint.create.clone())
                    .header("Idempotency-Key", key.as_ref())
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(form),
                Request::Refund { key, form } => endpoint
                    .http
                    .post(endpoint.refunds.clone())
                    .header("Idempotency-Key", key.as_ref())
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(form),
                Request::ListRefunds { payment_intent } => {
                    let mut url = endpoint.refunds.clone();
                    url.query_pairs_mut()
                        .append_pair("payment_intent", &payment_intent)
                        .append_pair("limit", "100");
                    endpoint.http.get(url)
                }
                Request::Search { query } => {
                    let mut url = endpoint.search.clone();
                    url.query_pairs_mut().append_pair("query", &query);
                    endpoint.http.get(url)
                }
            };
            let response = request
                .headers(headers)
                .bearer_auth(endpoint.api_key.expose())
                .send()
                .await?;
            let status = response.status().as_u16();
            let body = response.bytes().await?;
            Ok::<_, BoxError>(Reply { status, body })
        }
    })
}
