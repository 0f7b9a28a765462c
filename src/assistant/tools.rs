//! The tools the model may call. There is one, `charge`, as in the article's `PaymentTools`.
//!
//! The model's arguments are only checked against the checkout the client authorized;
//! what is charged, and under which key, comes from the [`CheckoutContext`].

use std::sync::LazyLock;

use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::context::CheckoutContext;
use crate::model::wire::{FunctionSpec, ToolCall, ToolSpec};
use crate::payments::money::json_decimal;
use crate::payments::{ChargeError, Money, PaymentGateway, Receipt};

pub const CHARGE: &str = "charge";

/// A tool call that cannot go on: the loop stops with this, the model is not asked again.
/// A tool adds its own error here, whole.
#[derive(Debug, thiserror::Error)]
pub enum ToolFailure {
    #[error(transparent)]
    Charge(#[from] ChargeError),
}

/// What a tool call produced.
pub struct ToolOutput {
    /// The tool message content sent back to the model (JSON).
    pub content: String,
    /// The receipt, when this call charged or found the order's charge.
    pub receipt: Option<Receipt>,
}

#[derive(Clone, Debug)]
pub struct ToolBox {
    gateway: PaymentGateway,
}

#[derive(Deserialize)]
struct ChargeArguments {
    #[serde(rename = "orderId", alias = "order_id")]
    order_id: String,
    /// Kept as written: a JSON number is read from its text, never through a float.
    amount: Box<RawValue>,
}

impl ToolBox {
    pub fn new(gateway: PaymentGateway) -> Self {
        ToolBox { gateway }
    }

    /// The tools offered to the model, built once.
    pub fn specs() -> &'static [ToolSpec] {
        static SPECS: LazyLock<Vec<ToolSpec>> = LazyLock::new(|| {
            vec![ToolSpec {
                kind: "function".into(),
                function: FunctionSpec {
                    name: CHARGE.into(),
                    description: "Charges the customer for an order. Calling it again for the same order does not charge twice.".into(),
                    parameters: json!({
                        "type": "object",
                        "properties": {
                            "orderId": {"type": "string", "description": "the order id"},
                            "amount": {"type": "string", "description": "the amount to charge, as a decimal such as 42.50"}
                        },
                        "required": ["orderId", "amount"],
                        "additionalProperties": false
                    }),
                },
            }]
        });
        &SPECS
    }

    /// Runs one tool call. A mistake of the model's (unknown tool, bad arguments, another
    /// order or amount) comes back as an error result for the model, and nothing is charged.
    pub async fn dispatch(
        &self,
        ctx: &CheckoutContext,
        call: &ToolCall,
    ) -> Result<ToolOutput, ToolFailure> {
        if call.function.name != CHARGE {
            return Ok(refused(format!(
                "there is no tool {:?}; the only tool is {CHARGE:?}",
                call.function.name
            )));
        }
        let args: ChargeArguments = match serde_json::from_str(&call.function.arguments) {
            Ok(args) => args,
            Err(err) => {
                return Ok(refused(format!(
                    "the arguments must be a JSON object with orderId and amount: {err}; nothing was charged"
                )));
            }
        };
        let order = ctx.order();
        if args.order_id != order.id().as_str() {
            return Ok(refused(format!(
                "order {:?} is not the order being checked out ({}); nothing was charged",
                args.order_id,
                order.id()
            )));
        }
        let asked = match json_decimal(&args.amount) {
            Some(text) => Money::parse(&text, order.amount().currency()),
            None => {
                return Ok(refused(
                    "amount must be a decimal string or number; nothing was charged".into(),
                ));
            }
        };
        match asked {
            Ok(amount) if amount == order.amount() => {}
            Ok(amount) => {
                return Ok(refused(format!(
                    "the authorized amount is {}, not {amount}; nothing was charged",
                    order.amount()
                )));
            }
            Err(err) => {
                return Ok(refused(format!("amount {err}; nothing was charged")));
            }
        }
        let doubt_before = ctx.charge_sending();
        let charged = self
            .gateway
            .charge(ctx.charge_key(), order.amount(), ctx.operation_key())
            .await
            .inspect_err(|err| {
                if err.charged_nothing() {
                    ctx.charge_not_sent(doubt_before);
                }
            })?;
        let receipt = charged.receipt;
        if charged.created {
            tracing::info!(order = %receipt.order_id, receipt = %receipt.id, "charge tool: charged the order");
        } else {
            tracing::info!(order = %receipt.order_id, receipt = %receipt.id, "charge tool: the order was already charged; returning its receipt, charging nothing");
        }
        ctx.record_charge(&receipt);
        let content = json!({
            "status": "charged",
            "orderId": receipt.order_id.as_str(),
            "amount": receipt.amount.decimal(),
            "currency": receipt.amount.currency().code(),
            "receiptId": receipt.id.to_string(),
            "alreadyCharged": !charged.created,
        })
        .to_string();
        Ok(ToolOutput {
            content,
            receipt: Some(receipt),
        })
    }
}

fn refused(reason: String) -> ToolOutput {
    tracing::info!(%reason, "tool call refused");
    ToolOutput {
        content: json!({"status": "error", "error": reason}).to_string(),
        receipt: None,
    }
}
