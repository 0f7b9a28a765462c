//! An operation as its Idempotency-Key record keeps it, rebuilt to run again (the
//! recovery sweep, an approval's resume): a checkout or a refund, told apart by the
//! request's `kind`.

use super::answer::HttpAnswer;
use super::checkout::{self, CheckoutRequest};
use super::refunds::{self, RefundRequest};
use super::state::AppState;
use crate::caller::Caller;
use crate::payments::OperationKey;

/// What an operation's recorded request asks.
#[derive(Debug)]
pub(crate) enum Resumable {
    Checkout(CheckoutRequest),
    Refund(RefundRequest),
}

/// The recorded request (JSON), checked again as its handler checks it.
pub(crate) fn rebuild(request: &str, max_amount: u64) -> Result<Resumable, String> {
    let fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(request).map_err(|err| err.to_string())?;
    if fields.get("kind").and_then(|k| k.as_str()) == Some("refund") {
        return refunds::rebuild(&fields).map(Resumable::Refund);
    }
    checkout::rebuild(request, max_amount).map(Resumable::Checkout)
}

impl Resumable {
    /// Runs the operation to its answer, as its handler would.
    pub(crate) async fn run(
        self,
        app: &AppState,
        operation_key: OperationKey,
        caller: &Caller,
        fence: Option<i64>,
    ) -> HttpAnswer {
        match self {
            Resumable::Checkout(request) => {
                checkout::run(app, request, operation_key, caller, fence).await
            }
            Resumable::Refund(request) => {
                Box::pin(refunds::run(app, request, operation_key, caller, fence)).await
            }
        }
    }
}
