//! The confirmation, rendered by the service from the receipt: the model chooses neither
//! the recipient nor a word of the text.

use std::time::SystemTime;

use lettre::Message;
use lettre::message::Mailbox;
use lettre::message::header::ContentType;
use sha2::{Digest, Sha256};

use super::address::Recipient;
use crate::payments::Receipt;
use crate::payments::store::Refund;

/// The Message-ID of an operation's message of `kind`: derived from the operation key and
/// its caller, so every delivery of it, by any instance, carries the same one and a
/// receiver can tell a repeat from a second message.
pub fn message_id(caller: &str, operation_key: &str, kind: &str, sender: &Mailbox) -> String {
    let mut hash = Sha256::new();
    for part in [caller, operation_key, kind] {
        // Length-prefixed: ("a", "bc") and ("ab", "c") hash apart.
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let hex = hex::encode(&hash.finalize()[..20]);
    format!("<{hex}.{kind}@{}>", sender.email.domain())
}

/// The whole confirmation message (headers and body) for `receipt`.
pub fn confirmation(
    sender: &Mailbox,
    to: &Recipient,
    message_id: &str,
    receipt: &Receipt,
) -> Result<Vec<u8>, lettre::error::Error> {
    let amount = &receipt.amount;
    let text = format!(
        "Thank you for your order.\r\n\r\n\
         Order:    {}\r\n\
         Amount:   {} {}\r\n\
         Receipt:  {}\r\n\
         Charged:  {}\r\n\r\n\
         Keep this message for your records. If this message reaches you twice, it is the \
         same confirmation (the same Message-ID), not a second charge.\r\n",
        receipt.order_id,
        amount.decimal(),
        amount.currency().code(),
        receipt.id,
        receipt.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
    );
    let message = Message::builder()
        .from(sender.clone())
        .to(Mailbox::new(None, to.address().clone()))
        .subject(format!("Payment confirmed: order {}", receipt.order_id))
        .message_id(Some(message_id.to_owned()))
        // The receipt's time, not the clock's: a message rendered again is the same bytes.
        .date(SystemTime::from(receipt.created_at))
        .header(ContentType::TEXT_PLAIN)
        .body(text)?;
    Ok(message.formatted())
}

/// The whole message confirming `refund` (headers and body).
pub fn refund_confirmation(
    sender: &Mailbox,
    to: &Recipient,
    message_id: &str,
    refund: &Refund,
) -> Result<Vec<u8>, lettre::error::Error> {
    let amount = &refund.amount;
    let text = format!(
        "Your refund is made.\r\n\r\n\
         Order:    {}\r\n\
         Refunded: {} {}\r\n\
         Refund:   {}\r\n\
         Made:     {}\r\n\r\n\
         Keep this message for your records. If this message reaches you twice, it is the \
         same confirmation (the same Message-ID), not a second refund.\r\n",
        refund.order_id,
        amount.decimal(),
        amount.currency().code(),
        refund.id,
        refund.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
    );
    let message = Message::builder()
        .from(sender.clone())
        .to(Mailbox::new(None, to.address().clone()))
        .subject(format!("Refund confirmed: order {}", refund.order_id))
        .message_id(Some(message_id.to_owned()))
        .date(SystemTime::from(refund.created_at))
        .header(ContentType::TEXT_PLAIN)
        .body(text)?;
    Ok(message.formatted())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_id_is_the_operations_own_and_names_the_senders_domain() {
        let sender: Mailbox = "Shop <shop@example.com>".parse().unwrap();
        let id = message_id("", "k-1", "confirmation", &sender);
        assert_eq!(id, message_id("", "k-1", "confirmation", &sender));
        assert!(
            id.starts_with('<') && id.ends_with(".confirmation@example.com>"),
            "{id}"
        );
        for other in [
            message_id("", "k-2", "confirmation", &sender),
            message_id("caller", "k-1", "confirmation", &sender),
            // Parts are length-prefixed: moving a character between them is another id.
            message_id("k", "-1", "confirmation", &sender),
        ] {
            assert_ne!(id, other);
        }
    }
}
