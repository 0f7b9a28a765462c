//! The HTTP API: router, one file per resource, errors, the OpenAPI document.

pub mod auth;
pub mod checkout;
pub mod error;
pub mod extract;
pub mod health;
pub mod idempotent;
pub mod receipts;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_swagger_ui::SwaggerUi;

use crate::assistant::Assistant;
use crate::caller::Gate;
use crate::config::Settings;
use crate::db::Database;
use crate::idempotency::Records;
use crate::payments::{PaymentGateway, Receipt};
use error::{Code, Problem};
pub use health::ModelInfo;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

struct Shared {
    settings: Settings,
    db: Database,
    gateway: PaymentGateway,
    records: Records,
    gate: Gate,
    assistant: Assistant,
    model: ModelInfo,
}

impl AppState {
    pub fn new(
        settings: Settings,
        db: Database,
        gateway: PaymentGateway,
        assistant: Assistant,
        model: ModelInfo,
        gate: Gate,
    ) -> Self {
        AppState(Arc::new(Shared {
            records: Records::new(&db),
            gate,
            settings,
            db,
            gateway,
            assistant,
            model,
        }))
    }

    pub fn settings(&self) -> &Settings {
        &self.0.settings
    }

    pub fn db(&self) -> &Database {
        &self.0.db
    }

    pub fn gateway(&self) -> &PaymentGateway {
        &self.0.gateway
    }

    pub fn records(&self) -> &Records {
        &self.0.records
    }

    /// Who may call `/checkout` and `/receipts`.
    pub fn gate(&self) -> &Gate {
        &self.0.gate
    }

    pub fn assistant(&self) -> &Assistant {
        &self.0.assistant
    }

    pub fn model_info(&self) -> &ModelInfo {
        &self.0.model
    }
}

/// A finished answer: what is sent, and what an idempotency record saves for replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    pub content_type: String,
    pub body: Bytes,
    pub retry_after: Option<u64>,
    /// A final outcome, saved under an Idempotency-Key and replayed: the same request
    /// would end the same way. Transient failures are not: a retry may well succeed.
    pub final_outcome: bool,
}

impl Answer {
    pub fn new(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Self {
        Answer {
            status,
            content_type: content_type.to_owned(),
            body: body.into(),
            retry_after: None,
            final_outcome: status.is_success(),
        }
    }

    pub fn json(status: StatusCode, body: &impl Serialize) -> Self {
        let body = serde_json::to_vec(body).expect("answers always serialize");
        Answer::new(status, "application/json", body)
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        if let Ok(value) = HeaderValue::from_str(&self.content_type) {
            headers.insert(header::CONTENT_TYPE, value);
        }
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// A receipt as the API shows it.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReceiptView {
    #[schema(example = "0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f")]
    pub id: String,
    #[schema(example = "A-100")]
    pub order_id: String,
    #[schema(example = "42.50")]
    pub amount: String,
    #[schema(example = "USD")]
    pub currency: String,
    /// RFC 3339, UTC.
    #[schema(example = "2026-12-02T18:37:03.123456Z")]
    pub created_at: String,
}

impl From<&Receipt> for ReceiptView {
    fn from(receipt: &Receipt) -> Self {
        ReceiptView {
            id: receipt.id.to_string(),
            order_id: receipt.order_id.to_string(),
            amount: receipt.amount.decimal(),
            currency: receipt.amount.currency().code().to_owned(),
            created_at: receipt
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        }
    }
}

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
        (name = "health", description = "Liveness and readiness"),
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
    router
        .merge(SwaggerUi::new("/swagger-ui").url("/api-docs/openapi.json", api))
        .fallback(|| async { Problem::new(Code::NotFound, "no such endpoint; see /swagger-ui/") })
        .layer(DefaultBodyLimit::max(settings.server.body_limit_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            server_timeout,
        ))
        .layer(axum::middleware::map_response(move |response: Response| {
            problem_for_bare_errors(response, server_timeout)
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
        // Outermost: whatever logs a request's headers sees the API key as sensitive.
        .layer(SetSensitiveRequestHeadersLayer::new([
            header::AUTHORIZATION,
        ]))
        .with_state(state)
}

/// The OpenAPI document, as served at `/api-docs/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_parts(None).1
}

/// The routes and their document; with the state, the callers' routes behind the API key
/// check.
fn api_parts(state: Option<&AppState>) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let callers = OpenApiRouter::new()
        .routes(routes!(checkout::checkout))
        .routes(routes!(receipts::get_receipt));
    let callers = match state {
        Some(state) => callers.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_caller,
        )),
        None => callers,
    };
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(callers)
        .routes(routes!(health::live))
        .routes(routes!(health::ready))
        .split_for_parts()
}

/// Answers made by the framework (an unknown method, the server timeout) carry no body;
/// give them the same problem+json as every other error.
async fn problem_for_bare_errors(response: Response, server_timeout: Duration) -> Response {
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
        StatusCode::GATEWAY_TIMEOUT => Problem::new(
            Code::DeadlineExceeded,
            format!(
                "the request did not finish within the server timeout of {} ms; if it charged, GET /receipts/{{orderId}} shows the receipt",
                server_timeout.as_millis()
            ),
        ),
        _ => return response,
    };
    let mut answer = problem.into_response();
    for (name, value) in response.headers() {
        answer.headers_mut().entry(name).or_insert(value.clone());
    }
    answer
}
