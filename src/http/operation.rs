//! [`Operation`]: what a client asked the service to do, as one serde type — a checkout
//! or a refund. Its JSON, tagged by `kind`, is the request an operation's Idempotency-Key
//! record keeps; read back, it is checked again as its handler checks it and run again
//! (an approval's resume, the recovery sweep) as its handler would run it.
//!
//! A new kind of operation is one variant here, its request type and its `run`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::admission::Slot;
use super::answer::HttpAnswer;
use super::checkout::{self, CheckoutRequest};
use super::idempotent;
use super::refunds::{self, RefundRequest};
use super::state::AppState;
use crate::caller::Caller;
use crate::db::StoreError;
use crate::idempotency::{Fingerprint, Lease};
use crate::payments::{Effect, OperationKey};

/// One operation, as its handler took it, checked.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Operation {
    /// `POST /checkout`.
    Checkout(CheckoutRequest),
    /// `POST /refunds`.
    Refund(RefundRequest),
}

/// An operation borrowed from its handler, which runs it: written as [`Operation`] is.
#[derive(Clone, Copy, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum OperationRef<'a> {
    Checkout(&'a CheckoutRequest),
    Refund(&'a RefundRequest),
}

impl OperationRef<'_> {
    /// The request's identity (another order, amount or address is another request; the
    /// answer's format is not) and the request, as its Idempotency-Key record keeps them.
    pub fn fingerprint(self) -> Fingerprint {
        let canonical = match self {
            OperationRef::Checkout(request) => request.canonical(),
            OperationRef::Refund(request) => request.canonical(),
        };
        let request = serde_json::to_string(&self).expect("an operation serializes");
        Fingerprint::new(canonical, request)
    }
}

impl Operation {
    /// What the operation does to its order's money.
    pub fn effect(&self) -> Effect {
        match self {
            Operation::Checkout(_) => Effect::Charge,
            Operation::Refund(_) => Effect::Refund,
        }
    }

    /// What [`OperationRef::fingerprint`] says of it.
    pub fn fingerprint(&self) -> Fingerprint {
        match self {
            Operation::Checkout(request) => OperationRef::Checkout(request),
            Operation::Refund(request) => OperationRef::Refund(request),
        }
        .fingerprint()
    }

    /// The operation a record keeps ([`Self::fingerprint`]'s request), checked again as
    /// its handler checks it. A record kept before operations were tagged has no `kind`:
    /// it is a checkout.
    pub fn from_record(request: &str) -> Result<Operation, String> {
        let mut fields: serde_json::Map<String, Value> =
            serde_json::from_str(request).map_err(|err| err.to_string())?;
        if !fields.contains_key("kind") {
            fields.insert("kind".into(), "checkout".into());
        }
        serde_json::from_value(Value::Object(fields)).map_err(|err| err.to_string())
    }

    /// Runs the operation to its answer, as its handler would: `caller`'s, under its
    /// Idempotency-Key lease's `fence` if any.
    pub async fn run(
        self,
        app: &AppState,
        operation_key: OperationKey,
        caller: &Caller,
        fence: Option<i64>,
    ) -> HttpAnswer {
        match self {
            Operation::Checkout(request) => {
                checkout::run(app, request, operation_key, caller, fence).await
            }
            Operation::Refund(request) => {
                Box::pin(refunds::run(app, request, operation_key, caller, fence)).await
            }
        }
    }
}

/// Counts an operation answered (`ok`, or its problem's code) in its effect's counter: a
/// checkout's in `checkout_checkouts_total`, a refund's in
/// `checkout_refund_operations_total`.
pub(crate) fn answered(app: &AppState, effect: Effect, code: &'static str) {
    match effect {
        Effect::Charge => app.metrics().checkout(code),
        Effect::Refund => app.metrics().refund_answered(code),
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
                operation.run(&app, key, &caller, fence).await
            }
        };
        idempotent::resume(app, lease, work).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkout recorded before operations were tagged (no `kind`) reads as a checkout,
    /// keeps its identity's text, and is written back tagged; the tagged record reads back
    /// as the same operation.
    #[test]
    fn a_checkout_record_without_a_kind_reads_and_writes_back_tagged() {
        let old = r#"{"orderId":"A-1","amount":"42.50","currency":"USD","paymentMethod":"pm_card_visa","email":"ann@example.com","accept":"text/plain","approval":"required"}"#;
        let operation = Operation::from_record(old).unwrap();
        assert_eq!(operation.effect(), Effect::Charge);
        let fingerprint = operation.fingerprint();
        assert_eq!(
            fingerprint.as_str(),
            "POST /checkout orderId=A-1 amount=4250 currency=USD paymentMethod=pm_card_visa email=ann@example.com"
        );
        assert_eq!(
            fingerprint.request(),
            r#"{"kind":"checkout","orderId":"A-1","amount":"42.50","currency":"USD","paymentMethod":"pm_card_visa","email":"ann@example.com","accept":"text/plain","approval":"required"}"#
        );
        let again = Operation::from_record(fingerprint.request()).unwrap();
        assert_eq!(again.fingerprint(), fingerprint);
    }

    #[test]
    fn a_refund_record_reads_back_as_the_same_refund() {
        let old = r#"{"kind":"refund","orderId":"A-1","amount":"20.00","currency":"EUR","reason":"damaged","email":"ann@example.com"}"#;
        let operation = Operation::from_record(old).unwrap();
        assert_eq!(operation.effect(), Effect::Refund);
        let Operation::Refund(refund) = &operation else {
            panic!("a refund: {operation:?}")
        };
        assert_eq!(refund.order.amount().minor(), 2000);
        assert_eq!(refund.order.amount().currency().code(), "EUR");
        let fingerprint = operation.fingerprint();
        assert_eq!(
            fingerprint.as_str(),
            r#"POST /refunds orderId=A-1 amount=rest reason="damaged" email=ann@example.com"#
        );
        let again = Operation::from_record(fingerprint.request()).unwrap();
        assert_eq!(again.fingerprint(), fingerprint);
    }

    #[test]
    fn a_record_that_does_not_check_is_refused() {
        for bad in [
            r#"{"kind":"capture","orderId":"A-1","amount":"1.00","currency":"USD"}"#,
            r#"{"orderId":"no spaces allowed","amount":"1.00","currency":"USD"}"#,
            r#"{"kind":"refund","orderId":"A-1","amount":"-1.00","currency":"USD"}"#,
            r#"{"orderId":"A-1","currency":"USD"}"#,
            "[]",
        ] {
            assert!(Operation::from_record(bad).is_err(), "{bad}");
        }
    }
}
