//! A person in front of the money: the paused checkout's 202, the approvals endpoints
//! (`GET /approvals`, `GET /approvals/{id}`, `POST /approvals/{id}/approve`,
//! `POST /approvals/{id}/deny`) and the sweep that expires the undecided.
//!
//! Approving reopens the operation in the approval's own transaction and runs it here,
//! from its journal, with the keys its first request minted; the answer is the checkout's.
//! The decision is the database's: the first conditional update from `pending` wins on
//! any instance, a repeat of it answers as it did, the other decision is 409.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::checkout;
use super::error::{Code, Problem};
use super::extract::Params;
use super::paused::ApprovalView;
use super::state::AppState;
use crate::approvals::Status;
use crate::caller::{Caller, Scope};
use crate::worker::{Worker, every};

pub(crate) mod decide;
mod errors;
pub mod links;
mod page;

pub use errors::ApprovalErrors;

/// Whether `caller` may see every caller's approvals (scope `approve`, or `read`).
fn sees_all(caller: &Caller) -> bool {
    caller.has(Scope::Approve) || caller.has(Scope::Read)
}

fn not_found(id: &str) -> Response {
    Problem::new(Code::NotFound, format!("there is no approval {id}")).into_response()
}

fn unavailable(err: impl std::fmt::Display) -> Response {
    Problem::unavailable(format!("cannot read the approvals: {err}")).into_response()
}

fn bad_id(id: &str) -> Response {
    Problem::invalid("id", format!("{id:?} is not an approval id (a UUID)")).into_response()
}

/// Which approvals to list.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsQuery {
    /// Only approvals of this status.
    status: Option<Status>,
    /// At most this many, newest first (default 100, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

/// Approvals, newest first.
#[derive(Serialize, ToSchema)]
pub struct ApprovalList {
    pub approvals: Vec<ApprovalView>,
}

#[utoipa::path(
    get,
    path = "/approvals",
    operation_id = "listApprovals",
    tag = "approvals",
    summary = "Approvals, newest first",
    description = "Every caller's with scope `approve` or `read`; otherwise the caller's own.",
    params(ApprovalsQuery),
    security(("api_key" = ["approve"]), ("api_key" = ["checkout"])),
    responses(
        (status = 200, description = "The approvals", body = ApprovalList),
        ApprovalErrors,
    )
)]
pub async fn list(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Params(query): Params<ApprovalsQuery>,
) -> Response {
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Problem::invalid("limit", "limit is from 1 to 1000").into_response();
    }
    let own = (!sees_all(&caller)).then_some(caller.name.as_str());
    match app.approvals().list(query.status, own, limit).await {
        Ok(found) => axum::Json(ApprovalList {
            approvals: found.iter().map(ApprovalView::from).collect(),
        })
        .into_response(),
        Err(err) => unavailable(err),
    }
}

#[utoipa::path(
    get,
    path = "/approvals/{id}",
    operation_id = "getApproval",
    tag = "approvals",
    summary = "One approval",
    description = "Scope `approve` or `read`, or the caller that asked for the checkout; anyone else's is 404.",
    params(("id" = uuid::Uuid, Path, description = "The approval's id (a UUID)")),
    security(("api_key" = ["approve"]), ("api_key" = ["checkout"])),
    responses(
        (status = 200, description = "The approval", body = ApprovalView),
        ApprovalErrors,
    )
)]
pub async fn get(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let Ok(uuid) = Uuid::parse_str(&id) else {
        return bad_id(&id);
    };
    match app.approvals().get(uuid).await {
        Ok(Some(approval)) if sees_all(&caller) || approval.caller == caller.name => {
            axum::Json(ApprovalView::from(&approval)).into_response()
        }
        Ok(_) => not_found(&id),
        Err(err) => unavailable(err),
    }
}

#[utoipa::path(
    post,
    path = "/approvals/{id}/approve",
    operation_id = "approveApproval",
    tag = "approvals",
    summary = "Approve a paused checkout, and finish it",
    description = "Scope `approve`. The first decision wins: the checkout resumes from its journal with the keys its first request minted, charges once, and this answers its 200 (the same body as POST /checkout). Repeated: the same answer. After a denial: 409 `approval_decided`; after the expiry: 410 `approval_expired`.",
    params(("id" = uuid::Uuid, Path, description = "The approval's id (a UUID)")),
    security(("api_key" = ["approve"])),
    responses(
        (status = 200, description = "The checkout's answer", body = checkout::CheckoutResponse),
        ApprovalErrors,
    )
)]
pub async fn approve(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let Ok(uuid) = Uuid::parse_str(&id) else {
        return bad_id(&id);
    };
    decide::approve(&app, &caller, uuid).await
}

/// A denial's reason.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DenyBody {
    /// Why, for the client that asked (at most 500 characters).
    #[schema(max_length = 500, example = "over this customer's usual spend")]
    pub reason: Option<String>,
}

#[utoipa::path(
    post,
    path = "/approvals/{id}/deny",
    operation_id = "denyApproval",
    tag = "approvals",
    summary = "Deny a paused checkout",
    description = "Scope `approve`. Nothing is charged and the model is not asked again; the operation's answer becomes 403 `approval_denied` with the reason. Repeated: the same answer. After an approval: 409 `approval_decided`; after the expiry: 410 `approval_expired`.",
    params(("id" = uuid::Uuid, Path, description = "The approval's id (a UUID)")),
    request_body(content = Option<DenyBody>, content_type = "application/json"),
    security(("api_key" = ["approve"])),
    responses(
        (status = 200, description = "The approval, denied", body = ApprovalView),
        ApprovalErrors,
    )
)]
pub async fn deny(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let Ok(uuid) = Uuid::parse_str(&id) else {
        return bad_id(&id);
    };
    let reason = if body.is_empty() {
        None
    } else {
        // `null` is no body, as the document's optional body says.
        match serde_json::from_slice::<Option<DenyBody>>(&body) {
            Ok(body) => body.and_then(|b| b.reason),
            Err(err) => {
                return Problem::invalid(
                    "body",
                    format!("the body is not {{\"reason\": \"…\"}}: {err}"),
                )
                .into_response();
            }
        }
    };
    decide::deny(&app, &caller, uuid, reason).await
}

/// Expires the approvals nobody decided in time, and counts those pending, every second.
pub struct ApprovalSweep(pub AppState);

impl Worker for ApprovalSweep {
    const NAME: &'static str = "approval expiry sweep";

    async fn run(self) {
        let app = &self.0;
        every(Duration::from_secs(1), || sweep(app)).await
    }
}

async fn sweep(app: &AppState) {
    match app.approvals().due().await {
        Ok(due) => {
            for id in due {
                decide::expire(app, id).await;
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, "approval sweep: cannot look for expired approvals")
        }
    }
    match app.approvals().pending().await {
        Ok(pending) => app.metrics().approvals_pending(pending),
        Err(err) => tracing::debug!(error = %err, "approval sweep: cannot count pending approvals"),
    }
}
