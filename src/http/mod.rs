//! The HTTP API: router, one file per resource, errors, the OpenAPI document.

pub mod admission;
pub mod agui;
pub mod answer;
mod api_doc;
pub mod approvals;
pub mod auth;
pub mod checkout;
pub mod error;
pub mod extract;
pub mod health;
pub mod idempotent;
pub mod metrics;
pub mod operation;
pub mod operations;
pub mod paused;
pub mod rate_limit;
pub mod receipts;
pub mod recovery;
pub mod refunds;
mod resume;
pub mod schema;
pub mod serve;
pub mod state;
pub mod stream;
pub mod views;

use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_swagger_ui::SwaggerUi;

use crate::metrics::{Metrics, TimedOut};

pub use answer::HttpAnswer;
use error::{Code, Problem};
pub use operation::{Operation, OperationRef};
pub use state::{AppState, ModelInfo, Parts};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "checkout",
        description = "An AI assistant takes a payment through a tool-calling loop; no retry, at any level, charges an order twice."
    ),
    components(schemas(error::ProblemBody)),
    modifiers(&BearerKey),
    tags(
        (name = "checkout", description = "Charge orders and read receipts"),
        (name = "approvals", description = "Charges above an amount wait for a person's decision"),
        (name = "health", description = "Liveness and readiness"),
        (name = "operations", description = "Metrics for Prometheus"),
    )
)]
struct ApiDoc;

/// The security scheme `/checkout` and `/receipts` name: an API key sent as a bearer
/// token, which Swagger UI's Authorize button fills in.
struct BearerKey;

pub const SECURITY_SCHEME: &str = "api_key";

impl utoipa::Modify for BearerKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            SECURITY_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("ck_ and 64 hex digits")
                    .description(Some(
                        "An API key made with `checkout api-keys create NAME`, sent as `Authorization: Bearer <key>`. Needed once any key exists (CHECKOUT_AUTH=auto), always (required), or never (off).",
                    ))
                    .build(),
            ),
        );
    }
}

/// The router and the OpenAPI document generated from its handlers.
pub fn router(state: AppState) -> Router {
    let (router, api) = api_parts(Some(&state));
    let settings = state.settings();
    let server_timeout = settings.server.timeout;
    let metrics = state.metrics().clone();
    router
        .merge(SwaggerUi::new("/swagger-ui").config(utoipa_swagger_ui::Config::from(api_doc::PATH)))
        .route(
            api_doc::PATH,
            axum::routing::get(api_doc::serve).with_state((
                state.clone(),
                api_doc::ApiDocs::new(schema::with_max_amount(api, settings.payments.max_amount)),
            )),
        )
        .fallback(|| async { Problem::new(Code::NotFound, "no such endpoint; see /swagger-ui/") })
        // One stack, applied once: each `Router::layer` boxes every request's future
        // again, and thousands of checkouts wait at once. Outermost first.
        .layer(
            ServiceBuilder::new()
                // Whatever logs a request's headers sees the API key as sensitive.
                .layer(SetSensitiveRequestHeadersLayer::new([
                    header::AUTHORIZATION,
                ]))
                .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
                .layer(TraceLayer::new_for_http().make_span_with(http_span))
                .layer(PropagateRequestIdLayer::x_request_id())
                .map_response(move |response: Response| {
                    problem_for_bare_errors(response, server_timeout, &metrics)
                })
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::GATEWAY_TIMEOUT,
                    server_timeout,
                ))
                .layer(DefaultBodyLimit::max(settings.server.body_limit_bytes)),
        )
        .with_state(state)
}

/// The span every request's log lines carry.
fn http_span(request: &Request) -> tracing::Span {
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
}

/// The OpenAPI document as served at `/api-docs/openapi.json`: with the API key
/// required, or (`open`) optional, as the service is while it needs no key.
pub fn openapi(open: bool) -> utoipa::openapi::OpenApi {
    let doc = api_parts(None).1;
    if open {
        api_doc::key_optional(doc)
    } else {
        doc
    }
}

/// The routes and their document; with the state, the callers' routes behind the API key
/// check.
fn api_parts(state: Option<&AppState>) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let checkout = OpenApiRouter::new()
        .routes(routes!(checkout::checkout))
        .routes(routes!(agui::run));
    let callers = match state {
        // The rate limit sits behind the API key check, which names the caller; when it
        // is off, it is not in the way at all (a layer costs every waiting request room).
        Some(state) => match state.rate_limit() {
            Some(limit) => checkout.route_layer(axum::middleware::from_fn_with_state(
                limit.clone(),
                rate_limit::limit,
            )),
            None => checkout,
        }
        .merge(read_and_decide())
        .route_layer(auth::RequireCaller(state.clone())),
        None => checkout.merge(read_and_decide()),
    };
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(callers)
        .routes(routes!(health::live))
        .routes(routes!(health::ready))
        .routes(routes!(metrics::metrics))
        .routes(routes!(
            approvals::links::show,
            approvals::links::decide_by_link
        ))
        .split_for_parts()
}

/// The callers' routes besides POST /checkout: receipts, operations, approvals.
fn read_and_decide() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(refunds::refund))
        .routes(routes!(receipts::get_receipt))
        .routes(routes!(operations::get))
        .routes(routes!(operations::operation_events))
        .routes(routes!(approvals::list))
        .routes(routes!(approvals::get))
        .routes(routes!(approvals::approve))
        .routes(routes!(approvals::deny))
}

/// Answers made by the framework (an unknown method, the server timeout) carry no body;
/// give them the same problem+json as every other error. A plain function in the stack,
/// not axum's async `map_response`, which boxed every request's future once more.
fn problem_for_bare_errors(
    response: Response,
    server_timeout: Duration,
    metrics: &Metrics,
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
