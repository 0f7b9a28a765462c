//! An operation run again without its client (a person's approval, the recovery sweep):
//! read back from its Idempotency-Key record and run as its handler runs it.

use super::admission::Slot;
use super::answer::HttpAnswer;
use super::checkout;
use super::idempotent;
use super::operation::Operation;
use super::refunds;
use super::state::AppState;
use crate::caller::Caller;
use crate::db::StoreError;
use crate::idempotency::Lease;
use crate::payments::OperationKey;

/// Runs the operation to its answer, as its handler would: `caller`'s, under its
/// Idempotency-Key lease's `fence` if any.
pub(crate) async fn run(
    operation: Operation,
    app: &AppState,
    operation_key: OperationKey,
    caller: &Caller,
    fence: Option<i64>,
) -> HttpAnswer {
    match operation {
        Operation::Checkout(request) => {
            checkout::run(app, request, operation_key, caller, fence).await
        }
        Operation::Refund(request) => {
            Box::pin(refunds::run(app, request, operation_key, caller, fence)).await
        }
    }
}

/// An operation read back from its record, ready to run again without its client: the
/// one way an operation resumes (a person's approval, the recovery sweep).
pub(crate) struct Resume {
    operation: Operation,
    key: OperationKey,
    /// Its asker, as the service knows it now: its budget applies as to its first run.
    caller: Caller,
}

/// Why a recorded operation cannot be resumed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResumeError {
    /// The record's request or key does not read: resuming it can never work.
    #[error("the operation's recorded request does not read: {0}")]
    Unreadable(String),
    /// Its caller cannot be read now.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Resume {
    /// `caller`'s operation `key`, whose record keeps `request`, checked again as its
    /// handler checked it.
    pub(crate) async fn read(
        app: &AppState,
        caller: &str,
        key: &str,
        request: &str,
    ) -> Result<Resume, ResumeError> {
        let operation = Operation::from_record(request).map_err(ResumeError::Unreadable)?;
        let key = OperationKey::from_client(key)
            .map_err(|err| ResumeError::Unreadable(err.to_string()))?;
        let caller = crate::caller::named(app.db(), caller).await?;
        Ok(Resume {
            operation,
            key,
            caller,
        })
    }

    pub(crate) fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Runs it to its answer under `lease` (taken over or handed on by a decision), in
    /// the admission `slot` it holds until it ends, and saves the answer for its client.
    pub(crate) async fn run(self, app: &AppState, lease: Lease, slot: Slot) -> HttpAnswer {
        let fence = Some(lease.fence);
        let work = {
            let app = app.clone();
            async move {
                let _slot = slot;
                let Resume {
                    operation,
                    key,
                    caller,
                } = self;
                run(operation, &app, key, &caller, fence).await
            }
        };
        idempotent::resume(app, lease, work).await
    }
}
