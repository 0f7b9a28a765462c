//! The conversation the loop opens, as in the article's `CheckoutAssistant`.

use crate::model::wire::Message;
use crate::payments::Order;

pub const SYSTEM: &str = "You are a checkout assistant. Use the charge tool to take the payment, then confirm it to the customer in one sentence.";
/// With the customer's address in the request: the same, and the confirmation email.
pub const SYSTEM_WITH_EMAIL: &str = "You are a checkout assistant. Use the charge tool to take the payment, then the send_confirmation tool to email the customer the confirmation, then confirm it to the customer in one sentence.";

/// The opening messages; `confirmation` when the send_confirmation tool is offered. The
/// operation key is not in them, nor the address: the model never sees either.
///
/// The order id is quoted: unquoted, a small model read `X.1:2` as the order `X.1` and the
/// amount `2` (docs/models.md, "With a real model", has the measurements behind each choice).
pub fn opening(order: &Order, confirmation: bool) -> Vec<Message> {
    vec![
        Message::System {
            content: if confirmation {
                SYSTEM_WITH_EMAIL
            } else {
                SYSTEM
            }
            .to_owned(),
        },
        Message::User {
            content: format!(
                "Charge order \"{}\" the amount of {} {}.",
                order.id(),
                order.amount().decimal(),
                order.amount().currency()
            ),
        },
    ]
}

/// Sent when the model ends in text without having charged: it names the call to make.
pub fn nudge(order: &Order) -> Message {
    Message::User {
        content: format!(
            "The order is not charged yet. Call the charge tool with {}.",
            super::tools::accepted_arguments(order)
        ),
    }
}

pub const REFUND_SYSTEM: &str = "You are a checkout assistant. Use the refund tool to give the customer the money back, then confirm it to the customer in one sentence.";
/// With the customer's address in the request: the same, and the confirmation email.
pub const REFUND_SYSTEM_WITH_EMAIL: &str = "You are a checkout assistant. Use the refund tool to give the customer the money back, then the send_confirmation tool to email the customer that the refund is made, then confirm it to the customer in one sentence.";

/// The opening messages of a refund: as [`opening`], the order quoted.
pub fn refund_opening(order: &Order, confirmation: bool) -> Vec<Message> {
    vec![
        Message::System {
            content: if confirmation {
                REFUND_SYSTEM_WITH_EMAIL
            } else {
                REFUND_SYSTEM
            }
            .to_owned(),
        },
        Message::User {
            content: format!(
                "Refund order \"{}\" the amount of {} {}.",
                order.id(),
                order.amount().decimal(),
                order.amount().currency()
            ),
        },
    ]
}

/// Sent when the model ends in text without having refunded.
pub fn refund_nudge(order: &Order) -> Message {
    Message::User {
        content: format!(
            "The refund is not made yet. Call the refund tool with {}.",
            super::tools::accepted_arguments(order)
        ),
    }
}
