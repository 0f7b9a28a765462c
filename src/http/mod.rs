//! The HTTP API: router, one file per resource, errors, the OpenAPI document.

pub mod answer;
pub mod checkout;
pub mod error;
pub mod extract;
pub mod health;
pub mod idempotent;
pub mod metrics;
pub mod receipts;
pub mod state;

use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_swagger_ui::SwaggerUi;

use crate::metrics::{Metrics, TimedOut};

pub use answer::Answer;
use error::{Code, Problem};
pub use state::{AppState, ModelInfo};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "checkout",
        description = "An AI assistant takes a payment through a tool-calling loop; no retry, at any level, charges an order twice."
    ),
    components(schemas(error::ProblemBody)),
    tags(
        (name = "checkout", description = "Charge orders and read receipts"),
        (name = "health", description = "Liveness and readiness"),
        (name = "operations", description = "Metrics for Prometheus"),
    )
)]
struct ApiDoc;

/// The router and the OpenAPI document generated from its handlers.
pub fn router(state: AppState) -> Router {
    let (router, api) = api_parts();
    let settings = state.settings();
    let server_timeout = settings.server.timeout;
    let metrics = state.metrics().clone();
    router
        .merge(SwaggerUi::new("/swagger-ui").url("/api-docs/openapi.json", api))
        .fallback(|| async { Problem::new(Code::NotFound, "no such endpoint; see /swagger-ui/") })
        .layer(DefaultBodyLimit::max(settings.server.body_limit_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            server_timeout,
        ))
        .layer(axum::middleware::map_response(move |response: Response| {
            problem_for_bare_errors(response, server_timeout, metrics.clone())
        }))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            TraceLayer::new_for_http().make_span_with(|request: &Request| {
                let path = request
                    .extensions()
                    .get::<MatchedPath>()
                    .map(MatchedPath::as_str)
                    .unwrap_or("unmatched");
                let request_id = request
                    .headers()
                    .get("x-request-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                tracing::info_span!("http", method = %request.method(), path, request_id)
            }),
        )
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .with_state(state)
}

/// The OpenAPI document, as served at `/api-docs/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_parts().1
}

fn api_parts() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(checkout::checkout))
        .routes(routes!(receipts::get_receipt))
        .routes(routes!(health::live))
        .routes(routes!(health::ready))
        .routes(routes!(metrics::metrics))
        .split_for_parts()
}

/// Answers made by the framework (an unknown method, the server timeout) carry no body;
/// give them the same problem+json as every other error.
async fn problem_for_bare_errors(
    response: Response,
    server_timeout: Duration,
    metrics: Metrics,
) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error())
        || response.headers().contains_key(header::CONTENT_TYPE)
    {
        return response;
    }
    let problem = match status {
        StatusCode::METHOD_NOT_ALLOWED => Problem::new(
            Code::MethodNotAllowed,
            "this endpoint does not take that method",
        ),
        StatusCode::GATEWAY_TIMEOUT => {
            metrics.timeout(TimedOut::Server);
            Problem::new(
                Code::DeadlineExceeded,
                format!(
                    "the request did not finish within the server timeout of {} ms; if it charged, GET /receipts/{{orderId}} shows the receipt",
                    server_timeout.as_millis()
                ),
            )
        }
        _ => return response,
    };
    let mut answer = problem.into_response();
    for (name, value) in response.headers() {
        answer.headers_mut().entry(name).or_insert(value.clone());
    }
    answer
}
