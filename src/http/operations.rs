//! `GET /operations/{operationKey}`: where a caller's operation stands, as its repeated
//! POST would say without running anything: 202 while it waits for an approval (its
//! saved 202, `Location` included) or runs, else its saved answer, status included.

use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use utoipa::openapi::{RefOr, Response as DocResponse};
use utoipa::{IntoParams, IntoResponses, ToSchema};

use super::answer::HttpAnswer;
use super::error::{Code, Problem, documented};
use super::extract::Params;
use super::idempotent;
use super::state::AppState;
use crate::caller::{AuthRefusal, Caller, Scope};

fn not_found(key: &str) -> Response {
    Problem::new(Code::NotFound, format!("there is no operation {key:?}")).into_response()
}

/// Whose operation.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OperationQuery {
    /// Another caller's operation (its API key's name): needs the scope `read`. The
    /// caller's own by default.
    #[param(max_length = 64)]
    pub(crate) caller: Option<String>,
}

/// The error answers of `GET /operations/{operationKey}`.
pub struct OperationErrors;

/// A saved answer is any the checkout gives, errors included (a denial's 403, an expiry's
/// 410, an amount conflict's 409, …): the checkout's, and the look-up's own.
impl IntoResponses for OperationErrors {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        let mut responses = super::checkout::CheckoutErrors::responses();
        responses.extend(documented([
            (
                "`unauthorized`: no valid API key (see WWW-Authenticate)",
                vec![Problem::unauthorized(AuthRefusal::Missing)],
            ),
            (
                "`not_found`: no such operation of this caller (or it expired)",
                vec![Problem::new(Code::NotFound, "there is no operation \"order-A-100\"")],
            ),
            (
                "`unavailable`: the database could not be reached",
                vec![
                    Problem::unavailable("cannot read the operation: pool timed out while waiting for an open connection"),
                ],
            ),
        ]));
        responses
    }
}

/// A saved 200: a checkout's answer or a refund's, as the operation's kind is. Only the
/// document's: the answer served is the operation's saved bytes.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code, reason = "describes the saved answer; never built")]
pub enum OperationResponse {
    Checkout(super::checkout::CheckoutResponse),
    Refund(super::refunds::RefundResponse),
}

/// An operation still running.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunningResponse {
    /// Always `running`.
    #[schema(example = "running")]
    pub status: &'static str,
    pub operation_key: String,
}

#[utoipa::path(
    get,
    path = "/operations/{operationKey}",
    operation_id = "getOperation",
    tag = "checkout",
    summary = "Where an operation stands",
    description = "The caller's own operation (another's with `?caller=NAME` and the scope `read`) (its Idempotency-Key, or the key the service minted and answered): 202 `requires_approval` while it waits for a person, 202 `running` while it runs, else its saved answer with its status. Nothing is run.",
    params(("operationKey" = String, Path, description = "The operation's key"), OperationQuery),
    security(("api_key" = ["checkout"]), ("api_key" = ["read"])),
    responses(
        (status = 200, description = "The operation's saved answer: a checkout's or a refund's, as the operation is (its status may be any the operation answers)", body = OperationResponse),
        (status = 202, description = "Waiting for an approval, or running", body = super::checkout::PausedResponse),
        OperationErrors,
    )
)]
pub async fn get(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    Params(query): Params<OperationQuery>,
) -> Response {
    // Another caller's operation is 404 without `read`, as one that does not exist.
    let owner = match query.caller {
        Some(owner) if owner != caller.name && !caller.has(Scope::Read) => {
            return not_found(&key);
        }
        Some(owner) => owner,
        None => caller.name,
    };
    match app.records().status(&owner, &key).await {
        Ok(Some(Ok(saved))) => idempotent::replay(saved),
        Ok(Some(Err(_))) => HttpAnswer::json(
            StatusCode::ACCEPTED,
            &RunningResponse {
                status: "running",
                operation_key: key,
            },
        )
        .into_response(),
        Ok(None) => {
            Problem::new(Code::NotFound, format!("there is no operation {key:?}")).into_response()
        }
        Err(err) => {
            Problem::unavailable(format!("cannot read the operation: {err}")).into_response()
        }
    }
}
