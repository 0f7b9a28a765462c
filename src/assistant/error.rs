//! How a checkout fails: [`FailureKind`] for one run of the loop, [`CheckoutError`]
//! after the loop retry, [`ToolFailure`] for a tool call that cannot go on.
use std::time::Duration;

use tower::BoxError;

use crate::approvals::Approval;
use crate::db::StoreError;
use crate::model::{ModelError, ModelErrorKind};
use crate::outbox::QueueError;
use crate::payments::gateway::RefundError;
use crate::payments::{ChargeError, Effect, Receipt};
use crate::retry::{Retried, Stop, Unit};

/// A tool call that cannot go on: the loop stops with this, the model is not asked again.
/// A tool adds its own error here, whole.
#[derive(Debug, thiserror::Error)]
pub enum ToolFailure {
    #[error(transparent)]
    Charge(#[from] ChargeError),
    #[error("cannot queue the confirmation: {0}")]
    Outbox(#[from] QueueError),
    /// The charge waits for a person: the operation has no approval yet, or one that is
    /// pending, denied or expired (`Some`). The loop stops, nothing charged, its journal
    /// kept.
    #[error("the charge needs a person's approval ({})", .0.as_ref().map_or("none yet", |a| a.status.as_str()))]
    Approval(Option<Box<Approval>>),
    #[error("cannot read or record the charge's approval: {0}")]
    Approvals(#[source] StoreError),
    /// Boxed: a checkout's failure stays as small as it was before refunds.
    #[error(transparent)]
    Refund(Box<RefundError>),
}

/// A checkout that did not end in a confirmed charge, after the loop retry had its say.
pub type CheckoutError = Retried<FailureKind>;

/// Why one run of the loop failed. Each layer below nests whole: a model round's error
/// as the request retry left it, a tool's as the tool gave it.
#[derive(Debug, thiserror::Error)]
pub enum FailureKind {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the model finished without charging the order")]
    ModelDidNotCharge,
    #[error("the model finished without refunding the order")]
    ModelDidNotRefund,
    #[error("the model was still calling tools after {0} rounds")]
    TooManyRounds(u32),
    #[error(transparent)]
    Tool(#[from] ToolFailure),
    #[error(transparent)]
    Journal(#[from] JournalFailure),
    #[error("the assistant loop did not finish within {} ms", .0.as_millis())]
    Timeout(Duration),
}

/// The journal could not be read or written, or does not fit the replay.
#[derive(Debug, thiserror::Error)]
pub enum JournalFailure {
    #[error("the journal did not answer: {0}")]
    Store(#[from] StoreError),
    /// This run's lease on the operation lapsed and another instance took it over: it
    /// resumes the operation from the journal; this run stops.
    #[error("another instance took this operation over after its lease lapsed; this run stopped")]
    LeaseLost,
    /// Never replayed silently: the journal names another step than the replay reached.
    #[error("the operation's journal does not match its replay at step {step}: {detail}")]
    Mismatch { step: i64, detail: String },
}

impl Unit for FailureKind {
    const LAYER: &'static str = "loop retry";
    const TRY: &'static str = "loop attempt";

    fn timed_out(after: Duration) -> Self {
        FailureKind::Timeout(after)
    }

    fn foreign(err: &BoxError) -> Self {
        unreachable!("the loop fails only with CheckoutError or the loop timeout: {err}")
    }
}

impl FailureKind {
    /// What the loop retry repeats: a loop timeout, a model failure the request retry
    /// could not mend, a database that did not answer, a payment provider that gave no
    /// outcome (the repeat re-sends the same key). Never a refusal by the model provider
    /// (4xx), a model that would not charge, an amount conflict, a declined payment.
    pub fn is_retryable(&self) -> bool {
        match self {
            FailureKind::Timeout(_) => true,
            FailureKind::Model(err) => match err.stop {
                Some(Stop::RetriesSpent) => true,
                // Not an answer that cannot be used: the endpoints would send it again.
                _ => false,
            },
            FailureKind::Tool(ToolFailure::Charge(ChargeError::Provider(err))) => {
                err.is_transient()
            }
            FailureKind::Tool(ToolFailure::Refund(err)) => err.is_transient(),
            FailureKind::Tool(_) | FailureKind::Journal(_) => {
                self.store_error().is_some_and(StoreError::is_transient)
            }
            FailureKind::ModelDidNotCharge
            | FailureKind::ModelDidNotRefund
            | FailureKind::TooManyRounds(_) => false,
        }
    }

    /// The model ended without doing the operation's effect.
    pub fn did_not(effect: Effect) -> FailureKind {
        match effect {
            Effect::Charge => FailureKind::ModelDidNotCharge,
            Effect::Refund => FailureKind::ModelDidNotRefund,
        }
    }

    /// A short stable name of the failure, for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            FailureKind::Timeout(_) => "timeout",
            FailureKind::Model(_) => "model",
            FailureKind::Tool(ToolFailure::Charge(charge)) => match charge {
                ChargeError::Provider(err) => err.reason(),
                ChargeError::Declined { .. } => "payment_declined",
                ChargeError::RequiresAction { .. } => "payment_requires_action",
                ChargeError::NoPaymentMethod => "no_payment_method",
                ChargeError::BudgetExceeded(_) => "budget_exceeded",
                ChargeError::AmountConflict { .. } | ChargeError::Store(_) => "database",
            },
            FailureKind::Tool(ToolFailure::Outbox(QueueError::Store(_))) => "database",
            FailureKind::Tool(ToolFailure::Outbox(QueueError::Render(_))) => "render",
            FailureKind::Tool(ToolFailure::Approval(approval)) => {
                match approval.as_ref().map(|a| a.status) {
                    Some(crate::approvals::Status::Denied) => "approval_denied",
                    Some(crate::approvals::Status::Expired) => "approval_expired",
                    _ => "approval_required",
                }
            }
            FailureKind::Tool(ToolFailure::Approvals(_)) => "database",
            FailureKind::Tool(ToolFailure::Refund(err)) => match &**err {
                RefundError::Provider(err) => err.reason(),
                RefundError::Refused { .. } => "refund_refused",
                RefundError::Exceeds { .. } => "refund_exceeds_charge",
                RefundError::NotCharged(_) => "not_charged",
                RefundError::Store(_) => "database",
            },
            FailureKind::Journal(_) => "journal",
            FailureKind::ModelDidNotCharge => "model_did_not_charge",
            FailureKind::ModelDidNotRefund => "model_did_not_refund",
            FailureKind::TooManyRounds(_) => "too_many_rounds",
        }
    }

    /// The receipt of the order's earlier charge, when the checkout failed because that
    /// charge was of another amount.
    pub fn amount_conflict(&self) -> Option<&Receipt> {
        match self {
            FailureKind::Tool(ToolFailure::Charge(ChargeError::AmountConflict {
                existing,
                ..
            })) => Some(existing),
            _ => None,
        }
    }

    /// The charge's own failure.
    pub fn charge_error(&self) -> Option<&ChargeError> {
        match self {
            FailureKind::Tool(ToolFailure::Charge(err)) => Some(err),
            _ => None,
        }
    }

    /// The database error a tool or the journal ran into.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            FailureKind::Tool(ToolFailure::Charge(ChargeError::Store(err)))
            | FailureKind::Tool(ToolFailure::Outbox(QueueError::Store(err)))
            | FailureKind::Tool(ToolFailure::Approvals(err)) => Some(err),
            FailureKind::Tool(ToolFailure::Refund(refund)) => match &**refund {
                RefundError::Store(err) => Some(err),
                _ => None,
            },
            FailureKind::Journal(JournalFailure::Store(err)) => Some(err),
            _ => None,
        }
    }

    /// The loop stopped for an approval: `Some(None)` when the operation has none yet.
    pub fn approval(&self) -> Option<Option<&Approval>> {
        match self {
            FailureKind::Tool(ToolFailure::Approval(approval)) => Some(approval.as_deref()),
            _ => None,
        }
    }

    /// The refund's own failure.
    pub fn refund_error(&self) -> Option<&RefundError> {
        match self {
            FailureKind::Tool(ToolFailure::Refund(err)) => Some(err),
            _ => None,
        }
    }

    /// The model round's error, as the request retry left it.
    pub fn model_error(&self) -> Option<&ModelError> {
        match self {
            FailureKind::Model(err) => Some(err),
            _ => None,
        }
    }

    /// Time ran out: the loop timeout, or a model request's timeout after its retries.
    pub fn is_deadline(&self) -> bool {
        match self {
            FailureKind::Timeout(_) => true,
            FailureKind::Model(err) => {
                matches!(err.kind, ModelErrorKind::Timeout(_))
                    && err.stop == Some(Stop::RetriesSpent)
            }
            _ => false,
        }
    }
}

impl CheckoutError {
    /// The layer that gave up: `loop retry` when its retries were spent, else the layer
    /// under it that ended the checkout (`request retry`, `loop timeout`); `None` when
    /// no retry or timeout layer was involved (an amount conflict, a model that did not
    /// charge).
    pub fn layer(&self) -> Option<&'static str> {
        if self.stop == Some(Stop::RetriesSpent) {
            return Some(FailureKind::LAYER);
        }
        match self.kind {
            FailureKind::Model(_) => Some(ModelErrorKind::LAYER),
            FailureKind::Timeout(_) => Some("loop timeout"),
            _ => None,
        }
    }
}
