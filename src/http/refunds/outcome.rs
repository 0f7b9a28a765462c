//! What a refund answers: the refund made, or the problem saying why none was.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use serde::Serialize;
use utoipa::openapi::{RefOr, Response as DocResponse};
use utoipa::{IntoResponses, ToSchema};

use crate::assistant::{CheckoutError, CheckoutOutcome, FailureKind, OperationContext};
use crate::caller::{AuthRefusal, Scope};
use crate::http::answer::HttpAnswer;
use crate::http::auth::forbidden;
use crate::http::error::{Code, Problem, documented};
use crate::http::extract::Format;
use crate::http::operation::answered;
use crate::http::state::AppState;
use crate::http::views::{ReceiptView, RefundView, UsageView};
use crate::outbox::Confirmation;
use crate::payments::Effect;

/// A refund made.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefundResponse {
    #[schema(example = "A-100")]
    pub order_id: String,
    pub refund: RefundView,
    /// True when this request made the refund; false when it found the refund an earlier
    /// run of this operation made (a retry after a crash, a resume).
    pub refunded: bool,
    /// The one-sentence confirmation.
    pub message: String,
    /// Who wrote `message`: `model`, or `service` when the refund is made and no model
    /// endpoint could write it.
    #[schema(example = "model")]
    pub message_source: &'static str,
    /// The `Idempotency-Key` sent, or the UUIDv7 minted for this operation: the refund key.
    pub operation_key: String,
    /// The order's receipt, with what is refunded of it now (`refundedAmount`).
    pub receipt: ReceiptView,
    #[schema(example = 1)]
    pub attempts: u32,
    pub usage: UsageView,
    /// The refund's confirmation email, when the request or the order's checkout named
    /// an address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
}

/// The answer of a refund's run: made (never an error once made), or why not.
pub(super) async fn answer(
    app: &AppState,
    ctx: &OperationContext,
    result: Result<CheckoutOutcome, CheckoutError>,
    format: Format,
) -> HttpAnswer {
    let outcome = match result {
        Ok(outcome) => Ok(outcome),
        // A refund made is never answered as an error (as a charge made is not).
        Err(err) => match ctx.refund_made() {
            Some(_)
                if !matches!(
                    err.kind,
                    FailureKind::Journal(crate::assistant::JournalFailure::LeaseLost)
                ) =>
            {
                match app.gateway().receipt(ctx.order().id()).await {
                    Ok(Some(receipt)) => {
                        tracing::warn!(order = %ctx.order().id(), error = %err, "the refund is made but the loop did not end with the model's confirmation; the service writes it");
                        Ok(CheckoutOutcome::written_by_service(
                            ctx,
                            receipt,
                            err.attempts,
                        ))
                    }
                    _ => Err(err),
                }
            }
            _ => Err(err),
        },
    };
    let mut outcome = match outcome {
        Ok(outcome) => outcome,
        Err(err) => {
            let problem = failure(app, ctx, &err).await;
            answered(app, Effect::Refund, problem.body.code.as_str());
            return problem.answer();
        }
    };
    let Some((refund, refunded)) = ctx.refund_made() else {
        let problem = Problem::new(
            Code::ModelDidNotRefund,
            "the loop ended without a refund; nothing was refunded",
        );
        return problem.answer();
    };
    answered(app, Effect::Refund, "ok");
    tracing::info!(order = %refund.order_id, refund = %refund.id, refunded, attempts = outcome.attempts, "refund confirmed");
    let closing = std::mem::take(&mut outcome.closing);
    if format == Format::Text {
        let mut answer =
            HttpAnswer::new(StatusCode::OK, "text/plain; charset=utf-8", outcome.message);
        answer.closing = closing;
        return answer;
    }
    let mut receipt = ReceiptView::from(&outcome.receipt);
    match app.gateway().refunds().refunded(&refund.order_id).await {
        Ok(Some(state)) => receipt.refunded_amount = Some(state.refunded_decimal()),
        Ok(None) => {}
        Err(err) => {
            tracing::warn!(error = %err, "cannot read what is refunded of the order; the answer leaves it out")
        }
    }
    let confirmation = match ctx.email() {
        Some(_) => {
            let key = ctx.journal_key();
            app.outbox()
                .refund_confirmation(&key.caller, &key.operation_key)
                .await
                .unwrap_or_default()
        }
        None => None,
    };
    let body = RefundResponse {
        order_id: refund.order_id.to_string(),
        refund: RefundView::from(&refund),
        refunded,
        message: outcome.message,
        message_source: outcome.message_source.as_str(),
        operation_key: ctx.operation_key().to_string(),
        receipt,
        attempts: outcome.attempts,
        usage: UsageView {
            models: ctx.models(),
            ..UsageView::from(outcome.usage)
        },
        confirmation,
    };
    let mut answer = HttpAnswer::json(StatusCode::OK, &body);
    answer.closing = closing;
    answer
}

/// Why no refund was made.
async fn failure(app: &AppState, ctx: &OperationContext, err: &CheckoutError) -> Problem {
    tracing::warn!(order = %ctx.order().id(), error = %err, "refund failed");
    if let Some(refused) = ctx.refused_refund() {
        let receipt = app.gateway().receipt(ctx.order().id()).await.ok().flatten();
        return match (refused, receipt) {
            (Some(state), Some(receipt)) => {
                let mut problem = super::exceeds(&receipt, &state, Some(ctx.order().amount()));
                problem.body.attempts = Some(err.attempts);
                problem
            }
            _ => Problem::new(
                Code::NotCharged,
                format!(
                    "order {} has no receipt: it has not been charged; nothing was refunded",
                    ctx.order().id()
                ),
            ),
        };
    }
    let code = Code::from(&err.kind);
    let mut problem = Problem::new(
        code,
        format!("{err}; nothing was refunded by this operation"),
    );
    if code == Code::Unavailable {
        problem = problem.retry_after(1);
    }
    problem.body.attempts = Some(err.attempts);
    problem.body.layer = err.layer().map(str::to_owned);
    if let Some(model) = err.kind.model_error() {
        problem.body.request_attempts = Some(model.attempts);
        problem.body.upstream_status = model.kind.upstream_status();
    }
    problem
}

/// The error answers of `POST /refunds`, each status with an example of each code.
pub struct RefundErrors;

impl IntoResponses for RefundErrors {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        let mut exceeds = Problem::new(
            Code::RefundExceedsCharge,
            "refunding 20.00 USD would pass what order A-100 was charged (50.00 USD): 10.00 USD is left to refund; nothing was refunded",
        );
        exceeds.body.refund_left = Some("10.00".into());
        documented([
            (
                "`invalid_request`: a field is missing or malformed",
                vec![Problem::invalid("orderId", "orderId is required")],
            ),
            (
                "`unauthorized`: no valid API key (see WWW-Authenticate)",
                vec![Problem::unauthorized(AuthRefusal::Missing)],
            ),
            (
                "`forbidden`: the API key lacks the scope `refund`",
                vec![forbidden(Scope::Refund)],
            ),
            (
                "`not_charged`: the order has no receipt (or another caller's, without the scope `read`)",
                vec![Problem::new(
                    Code::NotCharged,
                    "order A-100 has no receipt: it has not been charged; nothing was refunded",
                )],
            ),
            (
                "`refund_exceeds_charge`: the refund would pass what the order was charged; `refundLeft` says what is left. `in_flight`: a request with this Idempotency-Key is running",
                vec![
                    exceeds,
                    Problem::new(
                        Code::InFlight,
                        "a request with this Idempotency-Key is still being processed",
                    ),
                ],
            ),
            (
                "`key_reuse`: the Idempotency-Key was used for another request",
                vec![Problem::new(
                    Code::KeyReuse,
                    "this Idempotency-Key was first used for another request",
                )],
            ),
            (
                "`model_error`, `model_did_not_refund`, `provider_error`: nothing was refunded by this operation",
                vec![Problem::new(
                    Code::ModelDidNotRefund,
                    "the model finished without refunding the order; nothing was refunded by this operation",
                )],
            ),
            (
                "`unavailable`, `overloaded`",
                vec![Problem::new(
                    Code::Unavailable,
                    "cannot read the order's charge: pool timed out while waiting for an open connection",
                )],
            ),
        ])
    }
}
