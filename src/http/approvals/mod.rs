//! A person in front of the money: the paused checkout's 202, the approvals endpoints
//! (`GET /approvals`, `GET /approvals/{id}`, `POST /approvals/{id}/approve`,
//! `POST /approvals/{id}/deny`) and the sweep that expires the undecided.
//!
//! Approving reopens the operation in the approval's own transaction and runs it here,
//! from its journal, with the keys its first request minted; the answer is the checkout's.
//! The decision is the database's: the first conditional update from `pending` wins on
//! any instance, a repeat of it answers as it did, the other decision is 409.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::answer::HttpAnswer;
use super::auth::require;
use super::checkout::{self, ApprovalView, denied_answer, expired_answer, saved};
use super::error::{Code, Problem};
use super::extract::Params;
use super::idempotent;
use super::operation::{Resume, ResumeError};
use super::state::AppState;
use crate::approvals::{Approval, Decided, Status};
use crate::caller::{Caller, Scope};
use crate::idempotency::Lease;
use crate::worker::{Worker, every};

mod errors;

pub use errors::ApprovalErrors;

/// Whether `caller` may see every caller's approvals (scope `approve`, or `read`).
fn sees_all(caller: &Caller) -> bool {
    caller.has(Scope::Approve) || caller.has(Scope::Read)
}

fn not_found(id: &str) -> Response {
    Problem::new(Code::NotFound, format!("there is no approval {id}")).into_response()
}

fn unavailable(err: impl std::fmt::Display) -> Response {
    Problem::new(
        Code::Unavailable,
        format!("cannot read the approvals: {err}"),
    )
    .retry_after(1)
    .into_response()
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
    if let Some(refusal) = require(&caller, Scope::Approve) {
        return refusal;
    }
    // The resumed loop runs here: it takes an admission slot like any checkout, before
    // anything is decided (a full instance decides nothing).
    let Some(slot) = app.admission().try_admit() else {
        return app.admission().refusal().into_response();
    };
    let lease_for = app.settings().idempotency.lease;
    let decided = app.approvals().approve(uuid, &caller.name, lease_for).await;
    let (approval, lease) = match decided {
        Ok(Decided::Missing) => return not_found(&id),
        Ok(Decided::Now(approval, fence)) => {
            app.metrics().approval_decided("approved");
            tracing::info!(approval = %approval.id, order = %approval.order_id, amount = %approval.amount, decided_by = %caller.name, "approval approved; resuming the checkout from its journal");
            let lease = fence.map(|fence| Lease {
                caller: approval.caller.clone(),
                key: approval.operation_key.clone(),
                fence,
            });
            (approval, lease)
        }
        Ok(Decided::Before(approval)) => match approval.status {
            Status::Approved => (approval, None),
            Status::Denied | Status::Pending => {
                slot.unused();
                return decided_other_way(&approval);
            }
            Status::Expired => {
                slot.unused();
                return expire(&app, approval.id).await.into_response();
            }
        },
        Err(err) => return unavailable(err),
    };
    Box::pin(finish(&app, approval, lease, slot)).await
}

/// Runs the approved operation under `lease`, or, when another decider holds it, waits
/// for its answer (taking it over if its lease lapses), then answers the checkout's.
async fn finish(
    app: &AppState,
    approval: Approval,
    mut lease: Option<Lease>,
    slot: super::admission::Slot,
) -> Response {
    let (caller, key) = (approval.caller.clone(), approval.operation_key.clone());
    let records = app.records();
    let deadline = Instant::now() + app.settings().idempotency.lease * 3;
    let mut slot = Some(slot);
    loop {
        if let Some(lease) = lease.take() {
            let slot = slot.take().expect("one run");
            let request = match records.request(&caller, &key).await {
                Ok(Some(request)) => request,
                Ok(None) => return operation_gone(&approval),
                Err(err) => return unavailable(err),
            };
            return match Resume::read(app, &caller, &key, &request).await {
                Ok(resume) => resume.run(app, lease, slot).await.into_response(),
                Err(ResumeError::Store(err)) => unavailable(err),
                Err(err) => {
                    tracing::error!(key, caller, error = %err, "the approved operation is not resumed");
                    Problem::new(
                        Code::Unavailable,
                        format!("the approved {}: {err}", approval.kind),
                    )
                    .into_response()
                }
            };
        }
        match records.status(&caller, &key).await {
            Ok(Some(Ok(saved))) => return idempotent::replay(saved),
            Ok(Some(Err(left))) if left.is_zero() => {
                match records
                    .take_lapsed(&caller, &key, app.settings().idempotency.lease)
                    .await
                {
                    Ok(taken) => lease = taken,
                    Err(err) => return unavailable(err),
                }
            }
            Ok(Some(Err(_))) => {}
            Ok(None) => return operation_gone(&approval),
            Err(err) => return unavailable(err),
        }
        if lease.is_none() {
            if Instant::now() >= deadline {
                return Problem::new(
                    Code::InFlight,
                    format!(
                        "approval {} is approved and its checkout is running; repeat this request for its answer",
                        approval.id
                    ),
                )
                .retry_after(1)
                .into_response();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn operation_gone(approval: &Approval) -> Response {
    Problem::new(
        Code::NotFound,
        format!(
            "the operation of approval {} is no longer kept (its record expired)",
            approval.id
        ),
    )
    .into_response()
}

fn decided_other_way(approval: &Approval) -> Response {
    Problem::new(
        Code::ApprovalDecided,
        format!(
            "approval {} was {} by {:?} already; the first decision stands",
            approval.id,
            approval.status,
            approval.decided_by.as_deref().unwrap_or_default()
        ),
    )
    .into_response()
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
    if reason.as_ref().is_some_and(|r| r.chars().count() > 500) {
        return Problem::invalid("reason", "reason is at most 500 characters").into_response();
    }
    if let Some(refusal) = require(&caller, Scope::Approve) {
        return refusal;
    }
    let decided = app
        .approvals()
        .deny(uuid, &caller.name, reason.as_deref(), |a| {
            saved(&denied_answer(a))
        })
        .await;
    match decided {
        Ok(Decided::Missing) => not_found(&id),
        Ok(Decided::Now(approval, _)) => {
            app.metrics().approval_decided("denied");
            tracing::info!(approval = %approval.id, order = %approval.order_id, amount = %approval.amount, decided_by = %caller.name, reason = approval.reason.as_deref().unwrap_or_default(), "approval denied; nothing charged");
            axum::Json(ApprovalView::from(&approval)).into_response()
        }
        Ok(Decided::Before(approval)) => match approval.status {
            Status::Denied => axum::Json(ApprovalView::from(&approval)).into_response(),
            Status::Expired => expire(&app, approval.id).await.into_response(),
            Status::Approved | Status::Pending => decided_other_way(&approval),
        },
        Err(err) => unavailable(err),
    }
}

/// Expires `id` if it is due (its operation's answer becomes the 410), and answers 410.
async fn expire(app: &AppState, id: Uuid) -> HttpAnswer {
    match app
        .approvals()
        .expire(id, |a| saved(&expired_answer(a)))
        .await
    {
        Ok(Decided::Now(approval, _)) => {
            app.metrics().approval_decided("expired");
            tracing::info!(approval = %approval.id, order = %approval.order_id, "approval expired undecided; nothing charged");
            expired_answer(&approval)
        }
        Ok(Decided::Before(approval)) => expired_answer(&approval),
        Ok(Decided::Missing) => {
            Problem::new(Code::NotFound, format!("there is no approval {id}")).answer()
        }
        Err(err) => Problem::new(
            Code::Unavailable,
            format!("cannot expire approval {id}: {err}"),
        )
        .retry_after(1)
        .answer(),
    }
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
    match app.approvals().due(64).await {
        Ok(due) => {
            for id in due {
                expire(app, id).await;
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
