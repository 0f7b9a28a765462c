//! What a checkout answers: the confirmed checkout, or the problem saying which layer
//! gave up and whether the order is charged.

use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use crate::assistant::{
    ChargeReport, ChargeStatus, CheckoutError, CheckoutOutcome, FailureKind, JournalFailure,
    OperationContext,
};
use crate::http::answer::HttpAnswer;
use crate::http::error::{Code, Problem};
use crate::http::extract::Format;
use crate::http::state::AppState;
use crate::http::views::{ReceiptView, UsageView};
use crate::outbox::Confirmation;
use crate::payments::ChargeError;
use crate::payments::gateway::RefundError;
use crate::payments::store::BudgetLeft;

/// A confirmed checkout.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckoutResponse {
    #[schema(example = "A-100")]
    pub order_id: String,
    #[schema(example = "42.50")]
    pub amount: String,
    #[schema(example = "USD")]
    pub currency: String,
    /// The one-sentence confirmation.
    pub message: String,
    /// Who wrote `message`: `model`, or `service` when the order is charged and no model
    /// endpoint could write it (the service writes it from the receipt).
    #[schema(example = "model")]
    pub message_source: &'static str,
    pub receipt: ReceiptView,
    /// True when this operation made the charge; false when the order had been charged
    /// by an earlier operation and its receipt is returned instead.
    pub charged: bool,
    /// Runs of the assistant loop it took (more than 1 when the loop retry stepped in).
    #[schema(example = 1)]
    pub attempts: u32,
    /// The `Idempotency-Key` sent, or the UUIDv7 minted for this operation.
    pub operation_key: String,
    pub usage: UsageView,
    /// The confirmation email, when the request named an `email` and the assistant sent
    /// it: queued or sent, and its Message-ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
}

pub(super) fn success(
    ctx: &OperationContext,
    mut outcome: CheckoutOutcome,
    confirmation: Option<Confirmation>,
    format: Format,
) -> HttpAnswer {
    let usage = outcome.usage;
    let models = ctx.models();
    tracing::info!(
        order = %ctx.order().id(),
        receipt = %outcome.receipt.id,
        charged = outcome.charged,
        attempts = outcome.attempts,
        model_requests = usage.model_requests,
        replayed_steps = usage.replayed_steps,
        input_tokens = usage.input_tokens,
        output_tokens = usage.output_tokens,
        message_source = outcome.message_source.as_str(),
        models = ?models,
        "checkout confirmed"
    );
    let closing = std::mem::take(&mut outcome.closing);
    let mut answer = match format {
        Format::Text => {
            HttpAnswer::new(StatusCode::OK, "text/plain; charset=utf-8", outcome.message)
        }
        Format::Json => {
            let amount = ctx.order().amount();
            let body = CheckoutResponse {
                order_id: ctx.order().id().to_string(),
                amount: amount.decimal(),
                currency: amount.currency().code().to_owned(),
                message: outcome.message,
                message_source: outcome.message_source.as_str(),
                receipt: ReceiptView::from(&outcome.receipt),
                charged: outcome.charged,
                attempts: outcome.attempts,
                operation_key: ctx.operation_key().to_string(),
                usage: UsageView {
                    models,
                    ..UsageView::from(usage)
                },
                confirmation,
            };
            HttpAnswer::json(StatusCode::OK, &body)
        }
    };
    answer.closing = closing;
    answer
}

/// A paid order is never an error: a checkout whose order its attempts saw charged, and
/// that then failed in any way (out of time, of rounds, of model endpoints, a refusal by
/// the provider, the loop retry off), is confirmed with a sentence the service writes
/// from the receipt. Except for a run that lost its operation to another instance: the
/// operation's answer is that instance's to give (409 `in_flight` here, its saved answer
/// on the client's retry), so that one key never has two different answers.
pub(super) fn paid_anyway(
    ctx: &OperationContext,
    err: CheckoutError,
) -> Result<CheckoutOutcome, CheckoutError> {
    let ChargeStatus::Charged(receipt) = ctx.charge_status() else {
        return Err(err);
    };
    if matches!(err.kind, FailureKind::Journal(JournalFailure::LeaseLost)) {
        return Err(err);
    }
    tracing::warn!(
        order = %receipt.order_id,
        receipt = %receipt.id,
        error = %err,
        "the order is charged but the loop did not end with the model's confirmation; the service writes it from the receipt"
    );
    Ok(CheckoutOutcome::written_by_service(
        ctx,
        receipt,
        err.attempts,
    ))
}

/// The one place that says which error code a failed checkout is answered with.
impl From<&FailureKind> for Code {
    fn from(kind: &FailureKind) -> Code {
        match kind.charge_error() {
            Some(ChargeError::AmountConflict { .. }) => return Code::AmountConflict,
            Some(ChargeError::BudgetExceeded(_)) => return Code::BudgetExceeded,
            Some(ChargeError::Declined { .. }) => return Code::PaymentDeclined,
            Some(ChargeError::RequiresAction { .. }) => return Code::PaymentRequiresAction,
            Some(ChargeError::Provider(_) | ChargeError::NoPaymentMethod) => {
                return Code::ProviderError;
            }
            Some(ChargeError::Store(_)) | None => {}
        }
        match kind.refund_error() {
            Some(RefundError::Exceeds { .. }) => return Code::RefundExceedsCharge,
            Some(RefundError::NotCharged(_)) => return Code::NotCharged,
            Some(RefundError::Refused { .. }) => return Code::RefundRefused,
            Some(RefundError::Provider(_)) => return Code::ProviderError,
            Some(RefundError::Store(_)) | None => {}
        }
        match kind {
            FailureKind::Timeout(_) => Code::DeadlineExceeded,
            FailureKind::Model(_) if kind.is_deadline() => Code::DeadlineExceeded,
            FailureKind::Model(_) | FailureKind::TooManyRounds(_) => Code::ModelError,
            FailureKind::ModelDidNotCharge => Code::ModelDidNotCharge,
            FailureKind::ModelDidNotRefund => Code::ModelDidNotRefund,
            // The charge's refusals are above: what is left is the database.
            FailureKind::Tool(_) | FailureKind::Journal(JournalFailure::Store(_)) => {
                Code::Unavailable
            }
            FailureKind::Journal(JournalFailure::LeaseLost) => Code::InFlight,
            FailureKind::Journal(JournalFailure::Mismatch { .. }) => Code::JournalMismatch,
        }
    }
}

/// The order was charged another amount: what it was charged, and nothing more.
fn amount_conflict(err: &CheckoutError) -> Problem {
    let mut problem = Problem::new(
        Code::AmountConflict,
        format!("{}; nothing was charged", err.kind),
    );
    if let Some(existing) = err.kind.amount_conflict() {
        problem
            .body
            .charge(&ChargeReport::charged_before(existing.clone()));
    }
    problem
}

/// 403 `budget_exceeded`: what is left of the caller's budget today, nothing charged.
pub(crate) fn over_budget(ctx: &OperationContext, left: BudgetLeft, attempts: u32) -> Problem {
    let problem = Problem::new(
        Code::BudgetExceeded,
        format!(
            "charging {} for order {} would pass this caller's budget for today (UTC): {left} is left; nothing was charged",
            ctx.order().amount(),
            ctx.order().id()
        ),
    );
    let mut problem = not_charged(problem, ctx, None, attempts);
    problem.body.budget_left = Some(left.decimal());
    problem
}

/// The payment provider ended the attempt without charging.
fn not_charged(
    mut problem: Problem,
    ctx: &OperationContext,
    payment_id: Option<String>,
    attempts: u32,
) -> Problem {
    let body = &mut problem.body;
    body.payment_id = payment_id;
    body.attempts = Some(attempts);
    body.charge(&ChargeReport::not_charged(ctx.order().id().clone()));
    problem
}

/// The error answer, saying which layer gave up and whether the order is charged.
pub(super) async fn failure(app: &AppState, ctx: &OperationContext, err: CheckoutError) -> Problem {
    let usage = ctx.usage();
    tracing::warn!(
        order = %ctx.order().id(),
        error = %err,
        cause = ?std::error::Error::source(&err),
        model_requests = usage.model_requests,
        replayed_steps = usage.replayed_steps,
        input_tokens = usage.input_tokens,
        output_tokens = usage.output_tokens,
        "checkout failed"
    );
    // A charge refused over the budget, and the model then (rightly) not charging: the
    // refusal is the answer.
    if let Some(left) = ctx.over_budget()
        && ctx.charge_status() == ChargeStatus::NotCharged
    {
        return over_budget(ctx, left, err.attempts);
    }
    let code = Code::from(&err.kind);
    // The refusals answer from the failure alone; the rest ask the database what it holds.
    match (code, err.kind.charge_error()) {
        (Code::AmountConflict, _) => return amount_conflict(&err),
        (
            Code::PaymentDeclined,
            Some(ChargeError::Declined {
                decline_code,
                payment_id,
                ..
            }),
        ) => {
            let mut problem = Problem::new(
                code,
                format!(
                    "{}; the order was not charged; a new checkout of it makes a new attempt",
                    err.kind
                ),
            );
            problem.body.decline_code = Some(decline_code.clone());
            return not_charged(problem, ctx, payment_id.clone(), err.attempts);
        }
        (Code::PaymentRequiresAction, Some(ChargeError::RequiresAction { payment_id })) => {
            let problem = Problem::new(code, format!("{}; the order was not charged", err.kind));
            return not_charged(problem, ctx, Some(payment_id.clone()), err.attempts);
        }
        _ => {}
    }
    let mut report = ctx.charge_report(app.gateway()).await;
    // No receipt, but the provider may have charged under the intent it was sent: unknown
    // until a run settles the intent with its key.
    let intent_open = matches!(
        err.kind.charge_error(),
        Some(ChargeError::Provider(provider)) if !provider.charged_nothing()
    ) && report.order == ChargeStatus::NotCharged;
    let mut problem = if intent_open {
        Problem::new(
            code,
            format!(
                "{err}; whether the payment provider charged order {} is unknown: its payment intent stays open, and the next run of this checkout (a retry with the same Idempotency-Key, another checkout of the order, the recovery sweep) settles it under the same key, never charging it twice",
                ctx.order().id()
            ),
        )
    } else {
        Problem::new(code, format!("{err}; {report}"))
    };
    if code == Code::Unavailable {
        problem = problem.retry_after(1);
    }
    if let Some(wait) = err.kind.model_error().and_then(|m| m.kind.retry_after()) {
        // The provider said when it will take requests again; so do we.
        problem = problem.retry_after(wait.as_secs().max(1));
    }
    let body = &mut problem.body;
    body.attempts = Some(err.attempts);
    if let Some(model) = err.kind.model_error() {
        body.request_attempts = Some(model.attempts);
        body.upstream_status = model.kind.upstream_status();
    }
    body.layer = err.layer().map(str::to_owned);
    if intent_open {
        report.order = ChargeStatus::Unknown;
        report.this_checkout = ChargeStatus::Unknown;
    }
    body.charge(&report);
    problem
}
