//! [`Operation`]: what a client asked the service to do, as one serde type — a checkout
//! or a refund. Its JSON, tagged by `kind`, is the request an operation's Idempotency-Key
//! record keeps; read back, it is checked again as its handler checks it and run again
//! (an approval's resume, the recovery sweep) as its handler would run it.
//!
//! A new kind of operation is one variant here, its request type beside this file, and
//! its arm in `http::resume::run`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::extract::Format;
use super::state::AppState;
use crate::idempotency::Fingerprint;
use crate::payments::Effect;

mod checkout;
mod refund;

pub use checkout::CheckoutRequest;
pub use refund::RefundRequest;

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
}

/// What a request asked beside its order that does not make it another request, as its
/// record keeps it: the answer's format, and the approval the handler required.
#[derive(Serialize, Deserialize)]
struct Beside {
    /// `text/plain` when the client asked for the sentence alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    accept: Option<String>,
    /// `required` when the operation waits for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    approval: Option<String>,
}

impl Beside {
    fn new(format: Format, needs_approval: bool) -> Beside {
        Beside {
            accept: (format == Format::Text).then(|| "text/plain".into()),
            approval: needs_approval.then(|| "required".into()),
        }
    }

    fn format(&self) -> Format {
        match self.accept.as_deref() {
            Some("text/plain") => Format::Text,
            _ => Format::Json,
        }
    }

    fn needs_approval(&self) -> bool {
        self.approval.as_deref() == Some("required")
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
        let old = r#"{"kind":"refund","orderId":"A-1","amount":"20.00","currency":"EUR","reason":"damaged","email":"ann@example.com","accept":"text/plain","approval":"required"}"#;
        let operation = Operation::from_record(old).unwrap();
        assert_eq!(operation.effect(), Effect::Refund);
        let Operation::Refund(refund) = &operation else {
            panic!("a refund: {operation:?}")
        };
        assert_eq!(refund.order.amount().minor(), 2000);
        assert_eq!(refund.order.amount().currency().code(), "EUR");
        assert_eq!(refund.format, Format::Text);
        assert!(refund.needs_approval);
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
