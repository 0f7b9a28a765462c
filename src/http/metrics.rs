//! `GET /metrics`: the Prometheus text exposition of this app's metrics.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use super::state::AppState;

/// The content type of the Prometheus text format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    summary = "Metrics in the Prometheus text format",
    description = "Checkouts by outcome, charges created and found, retries and timeouts by layer, retry-budget refusals, rounds per loop, Idempotency-Key outcomes, and the model's request duration and token usage after the OpenTelemetry GenAI conventions. No label holds a key, an order id or an address.",
    responses((status = 200, description = "The metrics, scraped", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String, example = "# HELP checkout_checkouts_total Checkouts that ran to an answer, by outcome\n# TYPE checkout_checkouts_total counter\ncheckout_checkouts_total{code=\"ok\"} 3\n"))
)]
pub async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        app.metrics().render(),
    )
}
