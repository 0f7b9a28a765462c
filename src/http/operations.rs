//! `GET /operations/{operationKey}`: where a caller's operation stands, as its repeated
//! POST would say without running anything: 202 while it waits for an approval (its
//! saved 202, `Location` included) or runs, else its saved answer, status included.

use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
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
use super::stream::{Finish, Position, StreamEvent, Tail, respond};
use crate::caller::{AuthRefusal, Caller, Scope};

fn not_found(key: &str) -> Response {
    Problem::new(Code::NotFound, format!("there is no operation {key:?}")).into_response()
}

/// Whose operation `caller` asks for: its own, or another's with the scope `read`
/// (`None`: another's without it, answered as one that does not exist).
fn owner(caller: Caller, query: OperationQuery) -> Option<String> {
    match query.caller {
        Some(owner) if owner != caller.name && !caller.has(Scope::Read) => None,
        Some(owner) => Some(owner),
        None => Some(caller.name),
    }
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
        (status = 202, description = "Waiting for an approval, or running", body = super::paused::PausedResponse),
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
    let Some(owner) = owner(caller, query) else {
        return not_found(&key);
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

#[utoipa::path(
    get,
    path = "/operations/{operationKey}/events",
    operation_id = "getOperationEvents",
    tag = "checkout",
    summary = "An operation's steps as AG-UI events, resumed after Last-Event-ID",
    description = "Server-Sent Events in the AG-UI protocol (docs/streaming.md): what the operation's journal holds after `Last-Event-ID` (everything, from `RUN_STARTED`, without it), then its steps live as it runs, on any instance, then its answer as `RUN_FINISHED` (or `RUN_ERROR`). Nothing is run: a dropped stream resumed here never runs the loop or the charge again.",
    params(
        ("operationKey" = String, Path, description = "The operation's key"),
        ("Last-Event-ID" = Option<String>, Header, nullable = false, description = "The id of the last event received: `STEP` or `STEP.SUB`", pattern = r"^[0-9]{1,18}(\.[0-9]{1,18})?$"),
        OperationQuery
    ),
    security(("api_key" = ["checkout"]), ("api_key" = ["read"])),
    responses(
        (status = 200, description = "The operation's events", content_type = "text/event-stream", body = StreamEvent),
        OperationErrors,
    )
)]
pub async fn operation_events(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    headers: HeaderMap,
    Params(query): Params<OperationQuery>,
) -> Response {
    let Some(owner) = owner(caller, query) else {
        return not_found(&key);
    };
    let after = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => None,
        Some(text) => match text.ok().and_then(Position::parse) {
            Some(at) => Some(at),
            None => {
                return Problem::invalid(
                    "Last-Event-ID",
                    "Last-Event-ID is the id of an event of this stream: STEP or STEP.SUB",
                )
                .into_response();
            }
        },
    };
    match app.records().status(&owner, &key).await {
        Ok(Some(_)) => {}
        Ok(None) => return not_found(&key),
        Err(err) => {
            return Problem::unavailable(format!("cannot read the operation: {err}"))
                .into_response();
        }
    }
    let tail = Tail {
        after,
        ..Tail::new(&app, &owner, &key, key.clone())
    };
    respond(tail, Finish::Record)
}
