//! The conversation the loop opens, as in the article's `CheckoutAssistant`.

use crate::model::wire::Message;
use crate::payments::{Effect, Order};

pub const SYSTEM: &str = "You are a checkout assistant. Use the charge tool to take the payment, then confirm it to the customer in one sentence.";
/// With the customer's address in the request: the same, and the confirmation email.
pub const SYSTEM_WITH_EMAIL: &str = "You are a checkout assistant. Use the charge tool to take the payment, then the send_confirmation tool to email the customer the confirmation, then confirm it to the customer in one sentence.";

/// The opening messages of an operation that does `effect` to `order`; `confirmation`
/// when the send_confirmation tool is offered. The operation key is not in them, nor the
/// address: the model never sees either.
///
/// The order id is quoted: unquoted, a small model read `X.1:2` as the order `X.1` and the
/// amount `2` (docs/models.md, "With a real model", has the measurements behind each choice).
pub fn opening(effect: Effect, order: &Order, confirmation: bool) -> Vec<Message> {
    let (system, verb) = match (effect, confirmation) {
        (Effect::Charge, false) => (SYSTEM, "Charge"),
        (Effect::Charge, true) => (SYSTEM_WITH_EMAIL, "Charge"),
        (Effect::Refund, false) => (REFUND_SYSTEM, "Refund"),
        (Effect::Refund, true) => (REFUND_SYSTEM_WITH_EMAIL, "Refund"),
    };
    vec![
        Message::System {
            content: system.to_owned(),
        },
        Message::User {
            content: format!(
                "{verb} order \"{}\" the amount of {} {}.",
                order.id(),
                order.amount().decimal(),
                order.amount().currency()
            ),
        },
    ]
}

/// Sent when the model ends in text without having done the effect: it names the call to
/// make.
pub fn nudge(effect: Effect, order: &Order) -> Message {
    let not_yet = match effect {
        Effect::Charge => "The order is not charged yet. Call the charge tool",
        Effect::Refund => "The refund is not made yet. Call the refund tool",
    };
    Message::User {
        content: format!(
            "{not_yet} with {}.",
            super::tools::accepted_arguments(order)
        ),
    }
}

pub const REFUND_SYSTEM: &str = "You are a checkout assistant. Use the refund tool to give the customer the money back, then confirm it to the customer in one sentence.";
/// With the customer's address in the request: the same, and the confirmation email.
pub const REFUND_SYSTEM_WITH_EMAIL: &str = "You are a checkout assistant. Use the refund tool to give the customer the money back, then the send_confirmation tool to email the customer that the refund is made, then confirm it to the customer in one sentence.";
