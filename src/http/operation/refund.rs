//! [`RefundRequest`]: a refund as its handler took it, and as its record keeps it.

use serde::{Deserialize, Serialize};

use super::Beside;
use crate::http::extract::Format;
use crate::outbox::Recipient;
use crate::payments::{Currency, Money, Order, OrderId};

/// A refund as the handler took it, checked and authorized: what every run of its
/// operation starts from. Kept in its operation's record as `Recorded`.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "Recorded")]
pub struct RefundRequest {
    /// The order, with the amount to refund.
    pub order: Order,
    /// The amount as the client wrote it; `None`: what was left of the charge.
    pub asked: Option<String>,
    pub reason: Option<String>,
    pub email: Option<Recipient>,
    /// `email` is the address the order's checkout confirmed its payment to, not one the
    /// client named: not part of the request's identity.
    pub email_from_receipt: bool,
    pub format: Format,
    pub needs_approval: bool,
}

impl RefundRequest {
    /// The request's identity, as the client sent it (`amount`: `rest` for "what is
    /// left", so that a retry of it is the same request after the refund is made).
    pub(crate) fn canonical(&self) -> String {
        let mut canonical = format!(
            "POST /refunds orderId={} amount={}",
            self.order.id(),
            self.asked.as_deref().unwrap_or("rest")
        );
        if let Some(reason) = &self.reason {
            canonical.push_str(&format!(" reason={reason:?}"));
        }
        if let Some(email) = self.email.as_ref().filter(|_| !self.email_from_receipt) {
            canonical.push_str(&format!(" email={email}"));
        }
        canonical
    }
}

/// A refund as its operation's record keeps it: the refund the handler authorized (its
/// order and amount), and what the client asked beside it.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Recorded {
    order_id: String,
    amount: String,
    currency: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    asked: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    email: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    email_from_receipt: bool,
    #[serde(flatten)]
    beside: Beside,
}

impl Serialize for RefundRequest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let amount = self.order.amount();
        Recorded {
            order_id: self.order.id().as_str().to_owned(),
            amount: amount.decimal(),
            currency: amount.currency().code().to_owned(),
            asked: self.asked.clone(),
            reason: self.reason.clone(),
            email: self.email.as_ref().map(|e| e.as_str().to_owned()),
            email_from_receipt: self.email_from_receipt,
            beside: Beside::new(self.format, self.needs_approval),
        }
        .serialize(serializer)
    }
}

impl TryFrom<Recorded> for RefundRequest {
    type Error = String;

    fn try_from(recorded: Recorded) -> Result<RefundRequest, String> {
        let order_id = OrderId::parse(&recorded.order_id).map_err(|e| e.to_string())?;
        let currency = Currency::parse(&recorded.currency).map_err(|e| e.to_string())?;
        let amount = Money::parse(&recorded.amount, currency).map_err(|e| e.to_string())?;
        let email = recorded
            .email
            .as_deref()
            .map(Recipient::parse)
            .transpose()?;
        // As the handler authorized it when it first took the request.
        #[allow(
            clippy::disallowed_methods,
            reason = "the handler's refund, as recorded"
        )]
        let order = Order::new(order_id, amount);
        Ok(RefundRequest {
            order,
            asked: recorded.asked,
            reason: recorded.reason,
            email,
            email_from_receipt: recorded.email_from_receipt,
            format: recorded.beside.format(),
            needs_approval: recorded.beside.needs_approval(),
        })
    }
}
