//! Deciding an approval: approve, deny, expire. One home for every channel that decides
//! (the endpoints, an AG-UI run's resume): each decision is one conditional update in the
//! transaction that changes the operation's record (`crate::approvals`), and the first
//! wins on any instance.

use std::time::{Duration, Instant};

use axum::response::{IntoResponse, Response};
use uuid::Uuid;

use super::{not_found, unavailable};
use crate::approvals::{Approval, Decided, Status};
use crate::caller::{Caller, Scope};
use crate::http::admission::Slot;
use crate::http::answer::HttpAnswer;
use crate::http::auth::require;
use crate::http::error::{Code, Problem};
use crate::http::idempotent;
use crate::http::paused::{ApprovalView, denied_answer, expired_answer, saved};
use crate::http::resume::{Resume, ResumeError};
use crate::http::state::AppState;
use crate::idempotency::Lease;

/// `caller` approves approval `id`: the first decision wins; the operation resumes here
/// from its journal, and this answers its answer.
pub(crate) async fn approve(app: &AppState, caller: &Caller, id: Uuid) -> Response {
    if let Some(refusal) = require(caller, Scope::Approve) {
        return refusal;
    }
    // The resumed loop runs here: it takes an admission slot like any checkout, before
    // anything is decided (a full instance decides nothing).
    let Some(slot) = app.admission().try_admit() else {
        return app.admission().refusal().into_response();
    };
    let lease_for = app.settings().idempotency.lease;
    let decided = app.approvals().approve(id, &caller.name, lease_for).await;
    let (approval, lease) = match decided {
        Ok(Decided::Missing) => return not_found(&id.to_string()),
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
                return expire(app, approval.id).await.into_response();
            }
        },
        Err(err) => return unavailable(err),
    };
    Box::pin(finish(app, approval, lease, slot)).await
}

/// Runs the approved operation under `lease`, or, when another decider holds it, waits
/// for its answer (taking it over if its lease lapses), then answers the checkout's.
async fn finish(
    app: &AppState,
    approval: Approval,
    mut lease: Option<Lease>,
    slot: Slot,
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

/// `caller` denies approval `id`, for `reason`: the first decision wins; the operation's
/// answer becomes the denial, and nothing is charged.
pub(crate) async fn deny(
    app: &AppState,
    caller: &Caller,
    id: Uuid,
    reason: Option<String>,
) -> Response {
    if reason.as_ref().is_some_and(|r| r.chars().count() > 500) {
        return Problem::invalid("reason", "reason is at most 500 characters").into_response();
    }
    if let Some(refusal) = require(caller, Scope::Approve) {
        return refusal;
    }
    let decided = app
        .approvals()
        .deny(id, &caller.name, reason.as_deref(), |a| {
            saved(&denied_answer(a))
        })
        .await;
    match decided {
        Ok(Decided::Missing) => not_found(&id.to_string()),
        Ok(Decided::Now(approval, _)) => {
            app.metrics().approval_decided("denied");
            tracing::info!(approval = %approval.id, order = %approval.order_id, amount = %approval.amount, decided_by = %caller.name, reason = approval.reason.as_deref().unwrap_or_default(), "approval denied; nothing charged");
            axum::Json(ApprovalView::from(&approval)).into_response()
        }
        Ok(Decided::Before(approval)) => match approval.status {
            Status::Denied => axum::Json(ApprovalView::from(&approval)).into_response(),
            Status::Expired => expire(app, approval.id).await.into_response(),
            Status::Approved | Status::Pending => decided_other_way(&approval),
        },
        Err(err) => unavailable(err),
    }
}

/// Expires `id` if it is due (its operation's answer becomes the 410), and answers 410.
pub(crate) async fn expire(app: &AppState, id: Uuid) -> HttpAnswer {
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
        Err(err) => Problem::unavailable(format!("cannot expire approval {id}: {err}")).answer(),
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
