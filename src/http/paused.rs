//! An operation paused for a person's approval (docs/approvals.md): the loop stopped at
//! its effect (a charge, a refund), and `pause` records the approval and saves the
//! operation's 202 in one transaction; the views of an approval, and the operation's
//! answers once it is denied or expires, which the decisions (`http::approvals`) write.

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::approvals::{Approval, Links, Paused, Status};
use crate::assistant::OperationContext;
use crate::http::answer::HttpAnswer;
use crate::http::error::{Code, Problem};
use crate::http::operation::answered;
use crate::http::state::AppState;
use crate::idempotency::{Lease, Saved};

/// An approval, as the API shows it.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalView {
    /// UUIDv7.
    #[schema(example = "0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f")]
    pub id: String,
    #[schema(example = "A-100")]
    pub order_id: String,
    #[schema(example = "500.00")]
    pub amount: String,
    #[schema(example = "USD")]
    pub currency: String,
    pub status: Status,
    /// What waits: `charge` (POST /checkout) or `refund` (POST /refunds).
    #[schema(example = "charge")]
    pub kind: String,
    /// When it expires undecided (RFC 3339).
    pub expires_at: String,
    pub created_at: String,
    /// The operation that waits: its Idempotency-Key, or the key the service minted.
    pub operation_key: String,
    /// The caller that asked for the checkout (`""`: the open mode's anonymous caller).
    pub caller: String,
    /// Who decided (the API key's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    /// A denial's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<&Approval> for ApprovalView {
    fn from(a: &Approval) -> Self {
        let time = |t: chrono::DateTime<chrono::Utc>| {
            t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        };
        ApprovalView {
            id: a.id.hyphenated().to_string(),
            order_id: a.order_id.clone(),
            amount: a.amount.decimal(),
            currency: a.amount.currency().code().to_owned(),
            status: a.status,
            kind: a.kind.as_str().to_owned(),
            expires_at: time(a.expires_at),
            created_at: time(a.created_at),
            operation_key: a.operation_key.clone(),
            caller: a.caller.clone(),
            decided_by: a.decided_by.clone(),
            decided_at: a.decided_at.map(time),
            reason: a.reason.clone(),
        }
    }
}

/// Where an approval link's token goes (`http::approvals::links` serves it).
pub(crate) const LINK_PATH: &str = "/approvals/links/";

/// A pause's approve and deny links under `CHECKOUT_PUBLIC_URL`, if it is set.
fn links(app: &AppState) -> Option<Links> {
    let base = app.settings().webhooks.public_url.as_deref()?;
    let (approve, deny) = Links::tokens();
    let url = |token: &str| serde_json::Value::from(format!("{base}{LINK_PATH}{token}"));
    let announced = serde_json::Map::from_iter([
        ("approveUrl".to_owned(), url(&approve)),
        ("denyUrl".to_owned(), url(&deny)),
    ]);
    Some(Links {
        approve,
        deny,
        announced,
    })
}

/// The approval events' `data`: the approval as the API shows it.
pub(crate) fn approval_event(approval: &Approval) -> serde_json::Value {
    serde_json::to_value(ApprovalView::from(approval)).expect("a view serializes")
}

/// A checkout paused for a person's approval (202).
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PausedResponse {
    /// Always `requires_approval`.
    #[schema(example = "requires_approval")]
    pub status: String,
    pub operation_key: String,
    pub approval: ApprovalView,
    /// What happens next, for a person.
    pub message: String,
}

/// What the approval's operation does, done: `charged`, `refunded`.
fn done(approval: &Approval) -> &'static str {
    approval.kind.done()
}

/// The 202 of a checkout waiting for `approval`.
pub(crate) fn paused_answer(approval: &Approval) -> HttpAnswer {
    let message = format!(
        "The {} of {} for order {} waits for a person's approval (approval {}); nothing is {} until it is approved, and nothing if it is denied or expires at {}.",
        approval.kind,
        approval.amount,
        approval.order_id,
        approval.id,
        done(approval),
        approval
            .expires_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    let mut answer = HttpAnswer::json(
        StatusCode::ACCEPTED,
        &PausedResponse {
            status: "requires_approval".into(),
            operation_key: approval.operation_key.clone(),
            approval: approval.into(),
            message,
        },
    );
    answer.location = Some(format!("/approvals/{}", approval.id));
    answer
}

/// The operation's answer once a person denied its approval.
pub(crate) fn denied_answer(approval: &Approval) -> HttpAnswer {
    let by = approval.decided_by.as_deref().unwrap_or_default();
    let reason = approval
        .reason
        .as_deref()
        .map_or(String::new(), |r| format!(": {r}"));
    Problem::new(
        Code::ApprovalDenied,
        format!(
            "the {} of {} for order {} was denied by {by:?} (approval {}){reason}; nothing was {}",
            approval.kind,
            approval.amount,
            approval.order_id,
            approval.id,
            done(approval)
        ),
    )
    .answer()
}

/// The operation's answer once its approval expired undecided.
pub(crate) fn expired_answer(approval: &Approval) -> HttpAnswer {
    Problem::new(
        Code::ApprovalExpired,
        format!(
            "nobody decided approval {} of the {} of {} for order {} before it expired; nothing was {}",
            approval.id,
            approval.kind,
            approval.amount,
            approval.order_id,
            done(approval)
        ),
    )
    .answer()
}

pub(crate) fn saved(answer: &HttpAnswer) -> Saved {
    Saved {
        status: answer.status.as_u16(),
        content_type: answer.content_type.clone(),
        body: answer.body.to_vec(),
    }
}

/// The loop stopped at the charge for an approval (`found`: the operation's, if it has
/// one): records it and saves the 202 in one transaction, or answers the decision it
/// found.
pub(crate) async fn pause(
    app: &AppState,
    ctx: &OperationContext,
    found: Option<Approval>,
) -> HttpAnswer {
    match found.as_ref().map(|a| a.status) {
        Some(Status::Denied) => return denied_answer(found.as_ref().expect("found")),
        Some(Status::Expired) => return expired_answer(found.as_ref().expect("found")),
        _ => {}
    }
    let key = ctx.journal_key();
    let Some(fence) = key.fence else {
        // The handler keys every checkout that may pause: a pause is rows.
        return Problem::new(
            Code::Unavailable,
            "a checkout that needs an approval ran without its operation's record; nothing was charged",
        )
        .answer();
    };
    let lease = Lease {
        caller: key.caller.clone(),
        key: key.operation_key.clone(),
        fence,
    };
    let keep = app.settings().idempotency.ttl;
    let paused = app
        .approvals()
        .pause(
            &lease,
            ctx.order(),
            ctx.effect(),
            keep,
            links(app).as_ref(),
            |a| saved(&paused_answer(a)),
        )
        .await;
    match paused {
        Ok(Paused::Now(approval)) => {
            app.metrics().approval_requested();
            answered(app, ctx.effect(), "requires_approval");
            tracing::info!(approval = %approval.id, order = %approval.order_id, amount = %approval.amount, expires_at = %approval.expires_at, "checkout paused for a person's approval; nothing charged, the journal kept");
            let mut answer = paused_answer(&approval);
            answer.saved = true;
            answer
        }
        Ok(Paused::LeaseLost) => Problem::new(
            Code::InFlight,
            "another instance took this operation over while it paused for its approval; nothing was charged",
        )
        .retry_after(1)
        .answer(),
        Ok(Paused::Decided(approval)) => Problem::unavailable(format!(
                "approval {} was decided ({}) while this run paused; retry to go on with it",
                approval.id, approval.status
            ))
        .answer(),
        Err(err) => Problem::unavailable(format!("cannot record the charge's approval: {err}; nothing was charged"))
        .answer(),
    }
}
