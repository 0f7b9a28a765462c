//! The order a client asked to pay, and the keys that make paying it happen once.
//!
//! Parse, don't validate: each type here has one way in, and that way checks its input.
//! [`ChargeKey`] has no public constructor at all: it is taken from an [`Order`], which
//! only the handler's validation builds: `clippy.toml` lists [`Order::new`] under
//! `disallowed-methods`, so CI's `cargo clippy -- -D warnings` refuses a call anywhere
//! but under an `#[allow]` that names why: the handlers' validation of a client's request
//! (`http/checkout/input.rs`, `http/refunds/mod.rs`, against the order's receipt), an
//! operation's record read back as the handler took it (`http/operation/refund.rs`), and
//! tests' fixed orders. Nothing here implements `Deserialize` or `FromStr` for a key, so a
//! tool argument written by the model cannot become one:
//!
//! ```compile_fail
//! // A model's JSON cannot be turned into a charge key.
//! let key: checkout::payments::ChargeKey = serde_json::from_str(r#""A-100""#).unwrap();
//! ```
//!
//! Nor can a string: a [`Charge`], the one value the gateway charges, asks for the key
//! type. The two examples below differ only in the key argument, so the first fails for
//! that reason alone: were the key a `String`, it would compile; were `Charge::new` to
//! change its arguments, the second would stop compiling and say so.
//!
//! ```compile_fail
//! # use checkout::payments::{Charge, OperationKey, Order, PaymentGateway};
//! # async fn f(gateway: PaymentGateway, order: Order, op: OperationKey) {
//! let key = "A-100".to_string();
//! let charge = Charge::new(&key, order.amount(), &op, "caller");
//! gateway.charge(&charge, |_| Vec::new()).await;
//! # }
//! ```
//!
//! ```no_run
//! # use checkout::payments::{Charge, OperationKey, Order, PaymentGateway};
//! # async fn f(gateway: PaymentGateway, order: Order, op: OperationKey) {
//! let key = order.charge_key();
//! let charge = Charge::new(&key, order.amount(), &op, "caller");
//! gateway.charge(&charge, |_| Vec::new()).await;
//! # }
//! ```

use std::fmt;

use super::money::Money;

/// A validated order id: 1–64 of `A-Z a-z 0-9 . _ : -`, starting with a letter or digit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OrderId(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderIdError {
    #[error("must not be empty")]
    Empty,
    #[error("is {0} characters long; the most is 64")]
    TooLong(usize),
    #[error("must start with a letter or a digit")]
    BadStart,
    #[error("may hold only letters, digits and . _ : - (found {0:?})")]
    BadCharacter(char),
}

impl OrderId {
    pub const MAX_LEN: usize = 64;
    /// What an order id may hold besides ASCII letters and digits.
    pub const PUNCTUATION: &str = "._:-";

    pub fn parse(text: &str) -> Result<OrderId, OrderIdError> {
        let len = text.chars().count();
        if len == 0 {
            return Err(OrderIdError::Empty);
        }
        if len > Self::MAX_LEN {
            return Err(OrderIdError::TooLong(len));
        }
        if let Some(bad) = text
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || Self::PUNCTUATION.contains(*c)))
        {
            return Err(OrderIdError::BadCharacter(bad));
        }
        if !text.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            return Err(OrderIdError::BadStart);
        }
        Ok(OrderId(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the client authorized: this order, for exactly this amount (paid with this
/// payment method, when a payment provider takes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    id: OrderId,
    amount: Money,
    payment_method: Option<PaymentMethod>,
}

impl Order {
    pub fn new(id: OrderId, amount: Money) -> Self {
        Order {
            id,
            amount,
            payment_method: None,
        }
    }

    pub fn with_payment_method(self, payment_method: Option<PaymentMethod>) -> Self {
        Order {
            payment_method,
            ..self
        }
    }

    pub fn payment_method(&self) -> Option<&PaymentMethod> {
        self.payment_method.as_ref()
    }

    pub fn id(&self) -> &OrderId {
        &self.id
    }

    pub fn amount(&self) -> Money {
        self.amount
    }

    /// The key that makes this order's charge happen once: one order, one charge.
    pub fn charge_key(&self) -> ChargeKey {
        ChargeKey(self.id.clone())
    }
}

/// A payment provider's payment method id, as the client sent it: `pm_` and 1–252 of
/// `A-Z a-z 0-9 _` (Stripe's form, e.g. `pm_card_visa`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PaymentMethod(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaymentMethodError {
    #[error("must start with pm_ (a payment method id such as pm_card_visa)")]
    Prefix,
    #[error("is {0} characters long; the most is 255")]
    TooLong(usize),
    #[error("may hold only letters, digits and _ after pm_ (found {0:?})")]
    BadCharacter(char),
}

impl PaymentMethod {
    pub const MAX_LEN: usize = 255;
    /// Stripe's, on every payment method id.
    pub const PREFIX: &str = "pm_";

    pub fn parse(text: &str) -> Result<PaymentMethod, PaymentMethodError> {
        let len = text.chars().count();
        if len > Self::MAX_LEN {
            return Err(PaymentMethodError::TooLong(len));
        }
        let Some(rest) = text.strip_prefix(Self::PREFIX).filter(|r| !r.is_empty()) else {
            return Err(PaymentMethodError::Prefix);
        };
        if let Some(bad) = rest
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
        {
            return Err(PaymentMethodError::BadCharacter(bad));
        }
        Ok(PaymentMethod(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PaymentMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The idempotency key of a charge. Only an [`Order`] makes one, so every charge is
/// keyed by the order the client asked for, never by anything the model wrote.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChargeKey(OrderId);

impl ChargeKey {
    pub fn order_id(&self) -> &OrderId {
        &self.0
    }
}

/// One charge: the order's key, the amount, the payment method (with a payment
/// provider), and the operation and caller it is made for. The assistant's context makes
/// it from the validated order and the handler's keys; the gateway and the stores take it
/// whole.
#[derive(Clone, Copy, Debug)]
pub struct Charge<'a> {
    key: &'a ChargeKey,
    amount: Money,
    method: Option<&'a PaymentMethod>,
    operation: &'a OperationKey,
    caller: &'a str,
    /// The caller's budget for the day in the charge's currency, resolved by the handler
    /// from its API key and the settings (never from the model): `None`, no budget.
    budget: Option<Money>,
}

impl<'a> Charge<'a> {
    pub fn new(
        key: &'a ChargeKey,
        amount: Money,
        operation: &'a OperationKey,
        caller: &'a str,
    ) -> Charge<'a> {
        Charge {
            key,
            amount,
            method: None,
            operation,
            caller,
            budget: None,
        }
    }

    /// Paid with `method` (a payment provider's payment method).
    pub fn paid_with(self, method: Option<&'a PaymentMethod>) -> Charge<'a> {
        Charge { method, ..self }
    }

    /// Within the caller's budget for the day (`None`: no budget): the charge reserves its
    /// amount in the transaction that records it, or is refused.
    pub fn within(self, budget: Option<Money>) -> Charge<'a> {
        Charge { budget, ..self }
    }

    pub fn budget(&self) -> Option<Money> {
        self.budget
    }

    pub fn key(&self) -> &'a ChargeKey {
        self.key
    }

    pub fn order_id(&self) -> &'a OrderId {
        self.key.order_id()
    }

    pub fn amount(&self) -> Money {
        self.amount
    }

    pub fn method(&self) -> Option<&'a PaymentMethod> {
        self.method
    }

    pub fn operation(&self) -> &'a OperationKey {
        self.operation
    }

    pub fn caller(&self) -> &'a str {
        self.caller
    }
}

/// Names one HTTP operation: the client's `Idempotency-Key`, or a UUIDv7 minted by the
/// handler before anything is retried.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OperationKey(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperationKeyError {
    #[error("must be 1 to 255 characters long, got {0}")]
    Length(usize),
    #[error("may hold only printable ASCII (found {0:?})")]
    BadCharacter(char),
}

impl OperationKey {
    pub const MAX_LEN: usize = 255;

    /// A fresh key for a request that brought none. UUIDv7 sorts by time, so keys in the
    /// receipts table read in the order their operations started.
    pub fn mint() -> OperationKey {
        OperationKey(uuid::Uuid::now_v7().to_string())
    }

    /// A client's key: 1–255 characters of printable ASCII (space to `~`).
    pub fn from_client(text: &str) -> Result<OperationKey, OperationKeyError> {
        if text.is_empty() || text.len() > Self::MAX_LEN {
            return Err(OperationKeyError::Length(text.chars().count()));
        }
        if let Some(bad) = text.chars().find(|c| !(' '..='~').contains(c)) {
            return Err(OperationKeyError::BadCharacter(bad));
        }
        Ok(OperationKey(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OperationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_ids_follow_the_contract() {
        for ok in ["A-100", "a", "9", "ord_1.2:3-x", &"x".repeat(64)] {
            assert!(OrderId::parse(ok).is_ok(), "{ok:?} refused");
        }
        assert_eq!(OrderId::parse(""), Err(OrderIdError::Empty));
        assert_eq!(
            OrderId::parse(&"x".repeat(65)),
            Err(OrderIdError::TooLong(65))
        );
        assert_eq!(OrderId::parse("-A"), Err(OrderIdError::BadStart));
        assert_eq!(OrderId::parse("A 1"), Err(OrderIdError::BadCharacter(' ')));
        assert_eq!(OrderId::parse("A/1"), Err(OrderIdError::BadCharacter('/')));
        assert_eq!(OrderId::parse("Aé"), Err(OrderIdError::BadCharacter('é')));
    }

    #[test]
    fn payment_methods_are_pm_ids() {
        assert!(PaymentMethod::parse("pm_card_visa").is_ok());
        assert_eq!(PaymentMethod::parse("pm_"), Err(PaymentMethodError::Prefix));
        assert_eq!(
            PaymentMethod::parse("card"),
            Err(PaymentMethodError::Prefix)
        );
        assert_eq!(
            PaymentMethod::parse("pm_a-b"),
            Err(PaymentMethodError::BadCharacter('-'))
        );
        assert_eq!(
            PaymentMethod::parse(&format!("pm_{}", "x".repeat(253))),
            Err(PaymentMethodError::TooLong(256))
        );
    }

    #[test]
    fn operation_keys_are_printable_ascii_up_to_255() {
        assert!(OperationKey::from_client("a b~!").is_ok());
        assert!(OperationKey::from_client(&"k".repeat(255)).is_ok());
        assert_eq!(
            OperationKey::from_client(&"k".repeat(256)),
            Err(OperationKeyError::Length(256))
        );
        assert_eq!(
            OperationKey::from_client(""),
            Err(OperationKeyError::Length(0))
        );
        assert_eq!(
            OperationKey::from_client("a\tb"),
            Err(OperationKeyError::BadCharacter('\t'))
        );
    }

    #[test]
    fn minted_operation_keys_are_uuid_v7() {
        let key = OperationKey::mint();
        let uuid = uuid::Uuid::parse_str(key.as_str()).unwrap();
        assert_eq!(uuid.get_version_num(), 7);
    }
}
