//! `GET /health/live` and `GET /health/ready`.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::state::{AppState, ModelInfo};
use crate::config::{PaymentProvider, PaymentSettings};
use std::collections::BTreeMap;

use utoipa::IntoResponses;
use utoipa::openapi::{RefOr, Response as DocResponse};

use super::error::{Problem, documented};

#[derive(Serialize, ToSchema)]
pub struct Live {
    #[schema(example = "live")]
    status: &'static str,
}

#[derive(Serialize, ToSchema)]
pub struct Ready {
    #[schema(example = "ready")]
    status: &'static str,
    /// `postgres` or `sqlite`.
    #[schema(example = "sqlite")]
    database: &'static str,
    model: ModelInfo,
    payments: PaymentInfo,
    /// Every model endpoint, the primary first, with its circuit breaker's state. An
    /// open breaker does not make the instance unready: restarting it would not bring
    /// the endpoint back.
    endpoints: Vec<EndpointReady>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointReady {
    /// `model@base_url`.
    #[schema(example = "gpt-4o-mini@https://api.openai.com/v1")]
    endpoint: String,
    /// `closed`, `open` or `half_open`.
    #[schema(example = "closed")]
    breaker: &'static str,
}

/// Who moves the money.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PaymentInfo {
    /// `ledger` (the receipts table is the record of charges; no money moves elsewhere) or
    /// `stripe` (Stripe's PaymentIntents API, or a server speaking its subset).
    #[schema(example = "ledger")]
    provider: &'static str,
    /// The payment provider's API, with `stripe`.
    #[serde(skip_serializing_if = "Option::is_none")]
    base_url: Option<String>,
}

impl PaymentInfo {
    fn of(payments: &PaymentSettings) -> PaymentInfo {
        match payments.provider {
            PaymentProvider::Ledger => PaymentInfo {
                provider: "ledger",
                base_url: None,
            },
            PaymentProvider::Stripe => PaymentInfo {
                provider: "stripe",
                base_url: Some(payments.stripe_base_url.clone()),
            },
        }
    }
}

#[utoipa::path(
    get,
    path = "/health/live",
    tag = "health",
    summary = "The process is up",
    responses((status = 200, description = "The process runs", body = Live))
)]
pub async fn live() -> Json<Live> {
    Json(Live { status: "live" })
}

pub struct NotReady;

impl IntoResponses for NotReady {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        documented([(
            "`unavailable`: the database does not answer",
            vec![not_ready(
                "postgres",
                "pool timed out while waiting for an open connection",
            )],
        )])
    }
}

fn not_ready(database: &str, err: impl std::fmt::Display) -> Problem {
    Problem::unavailable(format!("the {database} database does not answer: {err}"))
}

#[utoipa::path(
    get,
    path = "/health/ready",
    tag = "health",
    summary = "The database answers; names the model and the payment provider in use",
    responses(
        (status = 200, description = "The database answers: the instance can take checkouts", body = Ready),
        NotReady,
    )
)]
pub async fn ready(State(app): State<AppState>) -> Response {
    match app.db().ping().await {
        Ok(()) => Json(Ready {
            status: "ready",
            database: app.db().kind(),
            model: app.model_info().clone(),
            payments: PaymentInfo::of(&app.settings().payments),
            endpoints: app
                .model_info()
                .breakers
                .iter()
                .map(|b| EndpointReady {
                    endpoint: b.name().to_owned(),
                    breaker: b.state().as_str(),
                })
                .collect(),
        })
        .into_response(),
        Err(err) => not_ready(app.db().kind(), err).into_response(),
    }
}
