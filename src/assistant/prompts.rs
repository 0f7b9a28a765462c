//! The conversation the loop opens, as in the article's `CheckoutAssistant`.

use crate::model::wire::Message;
use crate::payments::Order;

pub const SYSTEM: &str = "You are a checkout assistant. Use the charge tool to take the payment, then confirm it to the customer in one sentence.";

/// The opening messages. The operation key is not in them: the model never sees a key.
pub fn opening(order: &Order) -> Vec<Message> {
    vec![
        Message::System {
            content: SYSTEM.to_owned(),
        },
        Message::User {
            content: format!(
                "Charge order {} the amount of {} {}.",
                order.id(),
                order.amount().decimal(),
                order.amount().currency()
            ),
        },
    ]
}
