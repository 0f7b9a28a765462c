//! The script: what a good checkout assistant answers, and the wrong answers a fault asks for.

use std::time::SystemTime;

use serde_json::json;

use super::plan::{Fault, Quirk};
use crate::model::wire::{ChatRequest, Message};

/// What the order looks like to the model: read from the user message, as a model would.
struct Asked {
    order: String,
    amount: String,
}

/// Reads the opening user message, `Charge order "X" the amount of A C.` (a later user
/// message is a nudge, not a new order).
fn asked(chat: &ChatRequest) -> Option<Asked> {
    let text = chat.messages.iter().find_map(|m| match m {
        Message::User { content } => Some(content.as_str()),
        _ => None,
    })?;
    let words: Vec<&str> = text.split_whitespace().collect();
    let after = |word: &str| {
        words
            .iter()
            .position(|w| *w == word)
            .and_then(|i| words.get(i + 1))
            .map(|w| w.trim_end_matches('.').to_owned())
    };
    Some(Asked {
        order: after("order")?.trim_matches('"').to_owned(),
        amount: after("of")?,
    })
}

/// The receipt of a charge (or refund) tool result in the conversation, if there is one.
fn charged(chat: &ChatRequest) -> Option<serde_json::Value> {
    chat.messages.iter().find_map(|m| match m {
        Message::Tool { content, .. } => serde_json::from_str::<serde_json::Value>(content)
            .ok()
            .filter(|v| {
                matches!(
                    v.get("status").and_then(|s| s.as_str()),
                    Some("charged" | "refunded")
                )
            }),
        _ => None,
    })
}

/// Whether the conversation is a refund's: it offers `refund`, not `charge`.
fn refunding(chat: &ChatRequest) -> bool {
    chat.tools.iter().any(|tool| tool.function.name == "refund")
}

/// Whether a charge was refused for passing the caller's budget: charging again would
/// not change that.
fn over_budget(chat: &ChatRequest) -> bool {
    chat.messages.iter().any(|m| match m {
        Message::Tool { content, .. } => serde_json::from_str::<serde_json::Value>(content)
            .is_ok_and(|v| v.get("budgetLeft").is_some() || v.get("refundLeft").is_some()),
        _ => false,
    })
}

/// Whether the conversation offers `send_confirmation` (the request named an address).
fn confirmation_offered(chat: &ChatRequest) -> bool {
    chat.tools.iter().any(|tool| tool.function.name == CONFIRM)
}

/// Whether a `send_confirmation` call of the assistant's was answered after the charge:
/// with the message, or a refusal that asking again would not change. One refused for
/// coming before the charge does not count.
fn confirmation_called(chat: &ChatRequest) -> bool {
    let calls: Vec<&str> = chat
        .messages
        .iter()
        .flat_map(|m| match m {
            Message::Assistant { tool_calls, .. } => tool_calls.as_slice(),
            _ => &[],
        })
        .filter(|c| c.function.name == CONFIRM)
        .map(|c| c.id.as_str())
        .collect();
    chat.messages.iter().any(|m| match m {
        Message::Tool {
            tool_call_id,
            content,
        } => {
            calls.contains(&tool_call_id.as_str())
                && !content.contains("not charged yet")
                && !content.contains("not made yet")
        }
        _ => false,
    })
}

const CONFIRM: &str = "send_confirmation";

pub(super) fn assistant_answer(
    chat: &ChatRequest,
    number: u64,
    fault: Option<Fault>,
    quirks: &[Quirk],
) -> serde_json::Value {
    let completion = |text: Option<&str>, calls| completion(chat, number, text, calls, quirks);
    let Some(asked) = asked(chat) else {
        return completion(Some("I could not find an order to charge."), vec![]);
    };
    let done = charged(chat);
    let refund = refunding(chat);
    let tool = if refund { "refund" } else { "charge" };
    let call = |arguments: String| (String::from(tool), arguments);
    let charge_args =
        |order: &str, amount: &str| json!({"orderId": order, "amount": amount}).to_string();
    let calls: Vec<(String, String)> = match fault {
        Some(Fault::NoCharge) => {
            return completion(Some("Thank you, your order is noted."), vec![]);
        }
        Some(Fault::WrongOrder) => vec![call(charge_args(
            &format!("{}-OTHER", asked.order),
            &asked.amount,
        ))],
        Some(Fault::WrongAmount) => vec![call(charge_args(
            &asked.order,
            &format!("1{}", asked.amount),
        ))],
        Some(Fault::DoubleCharge) => {
            let args = charge_args(&asked.order, &asked.amount);
            vec![call(args.clone()), call(args)]
        }
        Some(Fault::Recharge) => vec![call(charge_args(&asked.order, &asked.amount))],
        Some(Fault::UnknownTool) => {
            let other = if refund { "charge" } else { "refund" };
            vec![(other.into(), charge_args(&asked.order, &asked.amount))]
        }
        Some(Fault::BadArguments) => {
            vec![call(format!(
                "{{\"orderId\": \"{}\", \"amount\": ",
                asked.order
            ))]
        }
        Some(Fault::MissingField) => vec![call(json!({"orderId": asked.order}).to_string())],
        Some(Fault::ConfirmFirst) if confirmation_offered(chat) && done.is_none() => {
            vec![(CONFIRM.into(), "{}".into())]
        }
        Some(Fault::DoubleConfirm) if confirmation_offered(chat) && done.is_some() => {
            vec![(CONFIRM.into(), "{}".into()), (CONFIRM.into(), "{}".into())]
        }
        Some(Fault::NumericAmount) if done.is_none() => vec![call(format!(
            "{{\"orderId\": {}, \"amount\": {}}}",
            serde_json::Value::String(asked.order.clone()),
            asked.amount
        ))],
        _ => match &done {
            Some(_) if confirmation_offered(chat) && !confirmation_called(chat) => {
                vec![(CONFIRM.into(), "{}".into())]
            }
            Some(refunded) if refund => {
                let field = |name: &str| refunded.get(name).and_then(|v| v.as_str()).unwrap_or("?");
                let text = format!(
                    "Your refund of {} {} for order {} is made; your refund is {}.{}",
                    field("amount"),
                    field("currency"),
                    field("orderId"),
                    field("refundId"),
                    if confirmation_called(chat) {
                        " A confirmation email is on its way."
                    } else {
                        ""
                    },
                );
                return completion(Some(&text), vec![]);
            }
            Some(receipt) => {
                let field = |name: &str| receipt.get(name).and_then(|v| v.as_str()).unwrap_or("?");
                let text = format!(
                    "Your payment of {} {} for order {} went through; your receipt is {}.{}",
                    field("amount"),
                    field("currency"),
                    field("orderId"),
                    field("receiptId"),
                    if confirmation_called(chat) {
                        " A confirmation email is on its way."
                    } else {
                        ""
                    },
                );
                return completion(Some(&text), vec![]);
            }
            None if over_budget(chat) && refund => {
                return completion(
                    Some(
                        "I could not make the refund: it would pass what the order was charged. Nothing was refunded.",
                    ),
                    vec![],
                );
            }
            None if over_budget(chat) => {
                return completion(
                    Some(
                        "I could not take the payment: it would pass today's spending budget. Nothing was charged.",
                    ),
                    vec![],
                );
            }
            None => vec![call(charge_args(&asked.order, &asked.amount))],
        },
    };
    completion(None, calls)
}

fn completion(
    chat: &ChatRequest,
    number: u64,
    text: Option<&str>,
    calls: Vec<(String, String)>,
    quirks: &[Quirk],
) -> serde_json::Value {
    let quirk = |q: Quirk| quirks.contains(&q);
    let tool_calls: Vec<serde_json::Value> = calls
        .into_iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            let id = if quirk(Quirk::SameId) {
                "call_0".to_owned()
            } else {
                format!("call_{number}_{}", i + 1)
            };
            let arguments = match serde_json::from_str::<serde_json::Value>(&arguments) {
                Ok(object) if quirk(Quirk::ObjectArguments) && object.is_object() => object,
                _ => serde_json::Value::String(arguments),
            };
            json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            })
        })
        .collect();
    let calling = !tool_calls.is_empty();
    let finish = match (
        calling,
        quirk(Quirk::FinishStop),
        quirk(Quirk::FinishToolCalls),
    ) {
        (true, true, _) | (false, _, false) => "stop",
        (true, false, _) | (false, _, true) => "tool_calls",
    };
    let text = match text {
        None if calling && quirk(Quirk::TextBeforeCall) => {
            Some("Let me take the payment for your order.")
        }
        None if calling && quirk(Quirk::EmptyContent) => Some(""),
        text => text,
    };
    let mut message = json!({"role": "assistant", "content": text});
    if calling {
        message["tool_calls"] = serde_json::Value::Array(tool_calls);
    }
    let created = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    // Tokens as a provider would count them, roughly: a token per four bytes of what
    // was sent and of what is answered, so that a saving in requests shows in tokens.
    let sent = serde_json::to_string(&chat.messages).map_or(0, |text| text.len());
    let (prompt_tokens, completion_tokens) =
        (sent.div_ceil(4), message.to_string().len().div_ceil(4));
    json!({
        "id": format!("chatcmpl-scripted-{number}"),
        "object": "chat.completion",
        "created": created,
        "model": chat.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    })
}
