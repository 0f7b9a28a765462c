//! [`CheckoutRequest`]: a checkout as its handler took it, and as its record keeps it.

use serde::{Deserialize, Serialize};

use super::Beside;
use crate::http::checkout::input::{CheckoutQuery, order, recipient};
use crate::http::extract::Format;
use crate::outbox::Recipient;
use crate::payments::Order;

/// A checkout as the handler took it, checked: what every run of its operation starts
/// from (the client's, a resume after a person's approval, the recovery sweep's). Kept
/// in its operation's record as `Recorded`, read back through the same checks.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "Recorded")]
pub struct CheckoutRequest {
    pub order: Order,
    pub email: Option<Recipient>,
    pub format: Format,
    /// The charge waits for a person's approval: decided when the request was taken
    /// (the amount against the caller's threshold then), kept with it.
    pub needs_approval: bool,
}

impl CheckoutRequest {
    /// The request's identity: the order, its payment method and the address (not the
    /// answer's format, nor the approval the handler required).
    pub(crate) fn canonical(&self) -> String {
        let amount = self.order.amount();
        let mut canonical = format!(
            "POST /checkout orderId={} amount={} currency={}",
            self.order.id(),
            amount.minor(),
            amount.currency()
        );
        // Only when given, so that a key's fingerprint without one stays as it was.
        if let Some(method) = self.order.payment_method() {
            canonical.push_str(&format!(" paymentMethod={method}"));
        }
        if let Some(email) = &self.email {
            canonical.push_str(&format!(" email={email}"));
        }
        canonical
    }
}

/// A checkout as its operation's record keeps it: the query's fields as the client
/// named them, and what the handler decided beside them.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Recorded {
    order_id: String,
    amount: String,
    currency: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    payment_method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    email: Option<String>,
    #[serde(flatten)]
    beside: Beside,
}

impl Serialize for CheckoutRequest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Recorded::from(self).serialize(serializer)
    }
}

impl From<&CheckoutRequest> for Recorded {
    fn from(request: &CheckoutRequest) -> Recorded {
        let amount = request.order.amount();
        Recorded {
            order_id: request.order.id().as_str().to_owned(),
            amount: amount.decimal(),
            currency: amount.currency().code().to_owned(),
            payment_method: request
                .order
                .payment_method()
                .map(|m| m.as_str().to_owned()),
            email: request.email.as_ref().map(|e| e.as_str().to_owned()),
            beside: Beside::new(request.format, request.needs_approval),
        }
    }
}

impl TryFrom<Recorded> for CheckoutRequest {
    type Error = String;

    /// Checked again as the handler checks a query, but for the largest amount, which
    /// the order met when it was taken, as it did the payment method's requirement.
    fn try_from(recorded: Recorded) -> Result<CheckoutRequest, String> {
        let query = CheckoutQuery {
            order_id: Some(recorded.order_id),
            amount: Some(recorded.amount),
            currency: Some(recorded.currency),
            email: None,
            payment_method: recorded.payment_method,
        };
        let email = recipient(recorded.email).map_err(|p| p.body.detail)?;
        let order = order(query, u64::MAX, false).map_err(|p| p.body.detail)?;
        Ok(CheckoutRequest {
            order,
            email,
            format: recorded.beside.format(),
            needs_approval: recorded.beside.needs_approval(),
        })
    }
}
