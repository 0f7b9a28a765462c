use std::fmt;
use std::time::Duration;

use crate::db::StoreError;
use crate::model::ModelError;
use crate::payments::{Money, Receipt};

/// A checkout that did not end in a confirmed charge, after the loop retry had its say.
#[derive(Debug)]
pub struct CheckoutError {
    pub kind: FailureKind,
    /// Loop attempts made, the failed one included.
    pub attempts: u32,
    /// Why the loop retry stopped (unset until it has seen the error).
    pub stop: Option<LoopStop>,
}

#[derive(Debug, thiserror::Error)]
pub enum FailureKind {
    #[error(transparent)]
    Model(ModelError),
    #[error("the model finished without charging the order")]
    ModelDidNotCharge,
    #[error("the model was still calling tools after {0} rounds")]
    TooManyRounds(u32),
    #[error("order {} was already charged {}, not {asked}", .existing.order_id, .existing.amount)]
    AmountConflict { existing: Receipt, asked: Money },
    #[error(transparent)]
    Store(StoreError),
    #[error("the assistant loop did not finish within {} ms", .0.as_millis())]
    Timeout(Duration),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopStop {
    NotRetryable,
    RetriesSpent,
    /// `CHECKOUT_LOOP_MAX_RETRIES` is 0.
    Off,
}

impl CheckoutError {
    pub fn new(kind: FailureKind, attempt: u32) -> Self {
        CheckoutError {
            kind,
            attempts: attempt,
            stop: None,
        }
    }
}

impl FailureKind {
    /// What the loop retry repeats: a loop timeout, a model failure the request retry
    /// could not mend, a database that did not answer. Never a refusal by the model
    /// provider (4xx), a model that would not charge, or an amount conflict.
    pub fn is_retryable(&self) -> bool {
        use crate::model::error::{ModelErrorKind, Stop};
        match self {
            FailureKind::Timeout(_) => true,
            FailureKind::Model(err) => match err.stop {
                Some(Stop::RetriesSpent) => true,
                // The request retry does not repeat a malformed answer; the next attempt
                // of the loop is a fresh conversation, which may well go right.
                _ => matches!(err.kind, ModelErrorKind::Malformed(_)),
            },
            FailureKind::Store(err) => err.is_transient(),
            FailureKind::ModelDidNotCharge
            | FailureKind::TooManyRounds(_)
            | FailureKind::AmountConflict { .. } => false,
        }
    }
}

impl fmt::Display for CheckoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        let attempts = self.attempts;
        let plural = if attempts == 1 { "" } else { "s" };
        match self.stop {
            None => Ok(()),
            Some(LoopStop::NotRetryable) => write!(
                f,
                "; the loop retry does not repeat this failure ({attempts} loop attempt{plural})"
            ),
            Some(LoopStop::RetriesSpent) => {
                write!(
                    f,
                    "; the loop retry gave up after {attempts} loop attempt{plural}"
                )
            }
            Some(LoopStop::Off) => write!(f, "; the loop retry is off"),
        }
    }
}

impl std::error::Error for CheckoutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.kind)
    }
}
