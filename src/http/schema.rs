//! The API document's schemas of the checked inputs, built from the constants their
//! parsers use, so that the document and the parsers cannot drift apart.

use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::{OpenApi, RefOr};

use crate::config::Settings;
use crate::outbox::{EMAIL_PATTERN, LOCAL_MAX_LEN, MAX_LEN};
use crate::payments::money::amount_pattern;
use crate::payments::{Currency, OrderId, PaymentMethod};

/// What an order id is, for the document's descriptions.
pub const ORDER_ID: &str =
    "The order id: 1–64 of `A-Z a-z 0-9 . _ : -`, starting with a letter or digit.";

/// An order id, as [`OrderId::parse`] takes it.
pub fn order_id() -> Schema {
    let chars = OrderId::PUNCTUATION;
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(OrderId::MAX_LEN))
        .pattern(Some(format!(
            "^[A-Za-z0-9][A-Za-z0-9{chars}]{{0,{}}}$",
            OrderId::MAX_LEN - 1
        )))
        .into()
}

/// An order id as a type, for the parameters a handler's `#[utoipa::path]` names:
/// `("orderId" = inline(schema::OrderIdText), Path, ..)`.
pub struct OrderIdText;

impl utoipa::PartialSchema for OrderIdText {
    fn schema() -> RefOr<Schema> {
        RefOr::T(order_id())
    }
}

impl utoipa::ToSchema for OrderIdText {}

/// The maximum amount of the default settings, which the document names unless
/// [`with_max_amount`] puts the configured one in.
pub fn default_max_amount() -> u64 {
    Settings::default().payments.max_amount
}

pub fn amount_description(max: u64) -> String {
    format!(
        "The amount, a decimal > 0 with at most the currency's minor digits (0 for JPY and KRW, 3 for BHD and KWD, 2 for the others), at most {max} whole units of it (CHECKOUT_MAX_AMOUNT): a plain decimal, no sign, no exponent, no separators. The pattern allows the most minor digits any currency has: fewer for a currency with fewer is a rule across two parameters, which no schema of one can say."
    )
}

/// An amount, under the default maximum.
pub fn amount() -> Schema {
    amount_up_to(default_max_amount())
}

/// An amount as [`Money::parse`](crate::payments::Money::parse) and
/// [`Money::at_most`](crate::payments::Money::at_most) take it, in a currency of the most
/// minor digits any has.
pub fn amount_up_to(max: u64) -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(amount_pattern(max, Currency::most_minor_digits())))
        .into()
}

/// `doc` with the amount of `POST /checkout` at most `max` whole units.
pub fn with_max_amount(mut doc: OpenApi, max: u64) -> OpenApi {
    let parameters = doc
        .paths
        .paths
        .get_mut("/checkout")
        .and_then(|item| item.post.as_mut())
        .and_then(|post| post.parameters.as_mut());
    for parameter in parameters.into_iter().flatten() {
        if let RefOr::T(parameter) = parameter
            && parameter.name == "amount"
        {
            parameter.description = Some(amount_description(max));
            parameter.schema = Some(RefOr::T(amount_up_to(max)));
        }
    }
    doc
}

/// The currencies taken, from the list the handler checks against.
pub fn currency() -> Schema {
    let codes = Currency::codes().map(serde_json::Value::from);
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(codes))
        .into()
}

pub fn email_description() -> String {
    format!(
        "The customer's address (one, at most {MAX_LEN} characters, at most {LOCAL_MAX_LEN} before the `@`): with it, the assistant also sends the confirmation email, once per operation."
    )
}

/// A customer's address, as `Recipient::parse` takes it: the address's pattern and
/// length and, as a second pattern that must hold too, the length of its local part
/// (the one pattern could say it only with a lookahead, which generators of test data
/// cannot satisfy).
pub fn email() -> Schema {
    let address = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(MAX_LEN))
        .pattern(Some(EMAIL_PATTERN));
    let local = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(format!("^[^@]{{1,{LOCAL_MAX_LEN}}}@")));
    AllOfBuilder::new()
        .schema_type(Type::String)
        .item(address)
        .item(local)
        .into()
}

/// A payment method, as [`PaymentMethod::parse`] takes it.
pub fn payment_method() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(PaymentMethod::MAX_LEN))
        .pattern(Some(format!("^{}[A-Za-z0-9_]+$", PaymentMethod::PREFIX)))
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_amount_names_its_maximum() {
        let doc = serde_json::to_value(amount_up_to(250)).unwrap();
        assert!(
            doc["pattern"].as_str().unwrap().contains("|0*250("),
            "{doc}"
        );
    }
}
