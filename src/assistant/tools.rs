//! The tools the model may call: `charge`, as in the article's `PaymentTools`, and, when
//! the request names the customer's `email`, `send_confirmation`.
//!
//! The model's arguments are only checked against the checkout the client authorized;
//! what is charged, and under which key, comes from the [`OperationContext`]. The
//! confirmation takes no arguments at all: its recipient is the request's, its text is
//! rendered from the receipt, its key is the operation key.

use std::sync::LazyLock;

use serde_json::json;
use tracing::Instrument;

use super::arguments::{ArgumentRefusal, ChargeArguments};
use super::context::{ChargeStatus, OperationContext};
use super::error::{FailureKind, JournalFailure, ToolFailure};
use crate::approvals::{Approvals, Status};
use crate::journal::NewEntry;
use crate::metrics::Metrics;
use crate::model::wire::{FunctionSpec, ToolCall, ToolList, ToolSpec, Tools};
use crate::outbox::Outbox;
use crate::payments::store::BudgetLeft;
use crate::payments::{ChargeError, Effect, Order, PaymentGateway, Receipt};
use crate::telemetry::genai;

mod refund;

pub use refund::REFUND;

pub const CHARGE: &str = "charge";
pub const SEND_CONFIRMATION: &str = "send_confirmation";

/// The tool that does `effect`: the call a paused operation waits on.
pub const fn tool_of(effect: Effect) -> &'static str {
    match effect {
        Effect::Charge => CHARGE,
        Effect::Refund => REFUND,
    }
}

/// The effect a tool does, if it does one.
pub fn effect_of(tool: &str) -> Option<Effect> {
    Effect::ALL
        .into_iter()
        .find(|effect| tool_of(*effect) == tool)
}

/// What a tool call produced.
pub struct ToolOutput {
    /// The tool message content sent back to the model (JSON).
    pub content: String,
    /// The receipt, when this call charged or found the order's charge.
    pub receipt: Option<Receipt>,
    /// The result's journal entries committed with the effect (a charge that made its
    /// receipt); otherwise the loop journals the result itself.
    pub journaled: bool,
}

#[derive(Clone, Debug)]
pub struct ToolBox {
    gateway: PaymentGateway,
    outbox: Outbox,
    approvals: Approvals,
    metrics: Metrics,
}

impl ToolBox {
    pub fn new(
        gateway: PaymentGateway,
        outbox: Outbox,
        approvals: Approvals,
        metrics: Metrics,
    ) -> Self {
        ToolBox {
            gateway,
            outbox,
            approvals,
            metrics,
        }
    }

    /// The tools offered to the model, built once with their JSON text: `charge`, and
    /// `send_confirmation` when the request named an address (`confirmation`). They are
    /// part of the journal's pins.
    pub fn offered(confirmation: bool) -> Tools {
        static WITH_CONFIRMATION: LazyLock<ToolList> = LazyLock::new(|| {
            let mut specs = ToolBox::offered(false).to_vec();
            specs.push(ToolSpec {
                kind: "function".into(),
                function: FunctionSpec {
                    name: SEND_CONFIRMATION.into(),
                    description: "Sends the customer the confirmation email of this checkout, after the order is charged. Takes no arguments: the service writes the message from the receipt. Calling it again sends nothing more.".into(),
                    parameters: raw(json!({
                        "type": "object",
                        "properties": {},
                        "additionalProperties": false
                    })),
                },
            });
            ToolList::new(specs)
        });
        if confirmation {
            return Tools::Offered(&WITH_CONFIRMATION);
        }
        static SPECS: LazyLock<ToolList> = LazyLock::new(|| {
            ToolList::new(vec![ToolSpec {
                kind: "function".into(),
                function: FunctionSpec {
                    name: CHARGE.into(),
                    description: "Charges the customer for an order. Calling it again for the same order does not charge twice.".into(),
                    parameters: raw(json!({
                        "type": "object",
                        "properties": {
                            "orderId": {"type": "string", "description": "the order id"},
                            "amount": {"type": "number", "description": "the amount to charge"}
                        },
                        "required": ["orderId", "amount"],
                        "additionalProperties": false
                    })),
                },
            }])
        });
        Tools::Offered(&SPECS)
    }

    /// The tools offered to an operation that does `effect`: `charge` or `refund`, and
    /// `send_confirmation` when the request named an address.
    pub fn offered_for(effect: Effect, confirmation: bool) -> Tools {
        match effect {
            Effect::Charge => ToolBox::offered(confirmation),
            Effect::Refund => refund::offered(confirmation),
        }
    }

    /// Runs one tool call, in its `execute_tool {name}` span. A mistake of the model's
    /// (unknown tool, bad arguments, another order or amount) comes back as an error result
    /// for the model, and nothing is charged. `journal`, when the loop's steps go to the
    /// database, makes the journal entries of a result, for an effect to commit them with
    /// its own row.
    pub async fn dispatch(
        &self,
        ctx: &OperationContext,
        call: &ToolCall,
        journal: Option<impl FnOnce(String) -> Vec<NewEntry>>,
    ) -> Result<ToolOutput, ToolFailure> {
        let span = genai::execute_tool(&call.function.name, &call.id);
        self.run(ctx, call, journal).instrument(span).await
    }

    async fn run(
        &self,
        ctx: &OperationContext,
        call: &ToolCall,
        journal: Option<impl FnOnce(String) -> Vec<NewEntry>>,
    ) -> Result<ToolOutput, ToolFailure> {
        if ctx.effect() == Effect::Refund {
            return Box::pin(self.run_refund(ctx, call, journal)).await;
        }
        let name = call.function.name.as_str();
        if name == SEND_CONFIRMATION && ctx.email().is_some() {
            return self.confirm(ctx).await;
        }
        if name != CHARGE {
            return Ok(refused(if ctx.email().is_some() {
                format!(
                    "there is no tool {name:?}; the tools are {CHARGE:?} and {SEND_CONFIRMATION:?}"
                )
            } else {
                format!("there is no tool {name:?}; the only tool is {CHARGE:?}")
            }));
        }
        let order = ctx.order();
        if let Err(refusal) =
            ChargeArguments::parse(&call.function.arguments).and_then(|args| args.check(order))
        {
            return Ok(refused_charge(&refusal, order));
        }
        if ctx.needs_approval() {
            self.approved(ctx).await?;
        }
        let doubt_before = ctx.effect_sending();
        let mut journaled = false;
        let charged = self
            .gateway
            .charge(&ctx.charge(), |made| {
                let Some(journal) = journal else {
                    return Vec::new();
                };
                let entries = journal(charge_result(made, false));
                journaled = !entries.is_empty();
                entries
            })
            .await
            .inspect_err(|err| {
                if err.charged_nothing() {
                    ctx.effect_not_sent(doubt_before);
                }
            });
        let charged = match charged {
            Err(ChargeError::BudgetExceeded(left)) => return Ok(self.over_budget(ctx, left)),
            charged => charged?,
        };
        let receipt = charged.receipt;
        self.metrics.charge(charged.created);
        // A charge made is an event of the `execute_tool charge` span, for traces; the log
        // says it once per checkout, in the line of its answer (receipt, charged). A charge
        // found (a retry, a second checkout of the order) is logged: it is the exception.
        if charged.created {
            tracing::info!(target: genai::TARGET, order = %receipt.order_id, receipt = %receipt.id, "charge tool: charged the order");
        } else {
            tracing::info!(order = %receipt.order_id, receipt = %receipt.id, "charge tool: the order was already charged; returning its receipt, charging nothing");
        }
        ctx.record_charge(&receipt);
        Ok(ToolOutput {
            content: charge_result(&receipt, !charged.created),
            receipt: Some(receipt),
            journaled: journaled && charged.created,
        })
    }

    /// Goes on only when a person approved this operation's charge; otherwise the loop
    /// stops with the approval as it stands (the handler records a new one).
    async fn approved(&self, ctx: &OperationContext) -> Result<(), ToolFailure> {
        let key = ctx.journal_key();
        // Boxed: a database statement's future, on a path few checkouts take.
        let approval = Box::pin(self.approvals.find(&key.caller, &key.operation_key))
            .await
            .map_err(ToolFailure::Approvals)?;
        match approval {
            Some(approval) if approval.status == Status::Approved => {
                tracing::info!(approval = %approval.id, decided_by = approval.decided_by.as_deref().unwrap_or_default(), "the charge or refund was approved; going on");
                Ok(())
            }
            approval => {
                tracing::info!(
                    status = approval.as_ref().map_or("none yet", |a| a.status.as_str()),
                    "the charge or refund needs a person's approval; the loop stops here, nothing done"
                );
                Err(ToolFailure::Approval(approval.map(Box::new)))
            }
        }
    }

    /// A charge refused for passing the caller's budget: the model is told (nothing was
    /// charged, what is left), and the checkout answers 403 `budget_exceeded`.
    fn over_budget(&self, ctx: &OperationContext, left: BudgetLeft) -> ToolOutput {
        self.metrics.budget_refusal();
        ctx.refused_over_budget(left);
        tracing::info!(order = %ctx.order().id(), left = %left, "charge tool: over the caller's budget for today; nothing was charged");
        ToolOutput {
            content: budget_result(&left, ctx.order()),
            receipt: None,
            journaled: false,
        }
    }

    /// `send_confirmation`: one outbox row for this operation, written only once this
    /// operation charged the order. The insert is keyed by the operation, so a second
    /// call, a loop retry or a resume that runs it again finds the row and writes nothing;
    /// its result is journaled like any tool's that has no effect of its own to commit with.
    async fn confirm(&self, ctx: &OperationContext) -> Result<ToolOutput, ToolFailure> {
        let receipt = match ctx.charge_status() {
            ChargeStatus::Charged(receipt) if ctx.made(&receipt) => receipt,
            ChargeStatus::Charged(receipt) => {
                return Ok(refused(format!(
                    "order {} was charged by an earlier checkout (receipt {}); its confirmation was that checkout's to send; nothing was sent",
                    receipt.order_id, receipt.id
                )));
            }
            ChargeStatus::NotCharged | ChargeStatus::Unknown => {
                return Ok(refused(format!(
                    "the order is not charged yet: call {CHARGE:?} first; nothing was sent"
                )));
            }
        };
        let email = ctx.email().expect("offered only with an address");
        let key = ctx.journal_key();
        // Boxed, as the provider's path is: a large future for a tool most checkouts
        // are not offered.
        let queued = Box::pin(self.outbox.queue_confirmation(
            &key.caller,
            &key.operation_key,
            email,
            &receipt,
        ))
        .await?;
        tracing::info!(target: genai::TARGET, order = %receipt.order_id, message_id = %queued.message_id, status = %queued.status, "send_confirmation tool: the confirmation is in the outbox");
        Ok(ToolOutput {
            content: json!({
                "status": queued.status,
                "messageId": queued.message_id,
                "orderId": receipt.order_id.as_str(),
            })
            .to_string(),
            receipt: None,
            journaled: false,
        })
    }

    /// A journaled result of `call`, as the model saw it then. A charge's receipt is read
    /// back (the journal keeps the result, the receipts table the charge): a result that
    /// names a receipt the order does not have is a mismatch, never replayed.
    pub async fn replayed(
        &self,
        ctx: &OperationContext,
        step: i64,
        call: &ToolCall,
        content: String,
    ) -> Result<ToolOutput, FailureKind> {
        if ctx.effect() == Effect::Refund && call.function.name == REFUND {
            return self.replayed_refund(ctx, step, content).await;
        }
        let charged: Option<String> = (call.function.name == CHARGE)
            .then(|| serde_json::from_str::<serde_json::Value>(&content).ok())
            .flatten()
            .filter(|result| result["status"] == "charged")
            .map(|result| result["receiptId"].as_str().unwrap_or_default().to_owned());
        let Some(receipt_id) = charged else {
            if call.function.name == CHARGE
                && let Some(left) = budget_refusal(&content, ctx)
            {
                ctx.refused_over_budget(left);
            }
            return Ok(ToolOutput {
                content,
                receipt: None,
                journaled: true,
            });
        };
        let receipt = self
            .gateway
            .receipt(ctx.order().id())
            .await
            .map_err(|err| FailureKind::Journal(JournalFailure::Store(err)))?
            .filter(|receipt| receipt.id.to_string() == receipt_id)
            .ok_or_else(|| JournalFailure::Mismatch {
                step,
                detail: format!(
                    "the journaled charge names receipt {receipt_id}, which order {} does not have",
                    ctx.order().id()
                ),
            })?;
        ctx.record_charge(&receipt);
        Ok(ToolOutput {
            content,
            receipt: Some(receipt),
            journaled: true,
        })
    }
}

/// A JSON schema as the text every request carries, written once.
fn raw(schema: serde_json::Value) -> Box<serde_json::value::RawValue> {
    serde_json::value::to_raw_value(&schema).expect("a schema always serializes")
}

/// What the model is told of a charge: written straight from the receipt (a JSON value
/// built first cost as much as the rest of the tool).
fn charge_result(receipt: &Receipt, already_charged: bool) -> String {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Charged<'a> {
        status: &'static str,
        order_id: &'a str,
        amount: String,
        currency: &'a str,
        receipt_id: uuid::fmt::Hyphenated,
        already_charged: bool,
    }
    serde_json::to_string(&Charged {
        status: "charged",
        order_id: receipt.order_id.as_str(),
        amount: receipt.amount.decimal(),
        currency: receipt.amount.currency().code(),
        receipt_id: receipt.id.hyphenated(),
        already_charged,
    })
    .expect("a charge result always serializes")
}

/// What the model is told of a charge over the caller's budget.
fn budget_result(left: &BudgetLeft, order: &Order) -> String {
    json!({
        "status": "error",
        "error": format!(
            "charging {} would pass this caller's budget for today: {left} is left; nothing was charged; do not call {CHARGE:?} again, tell the customer the payment was not taken",
            order.amount()
        ),
        "budgetLeft": left.decimal(),
        "currency": left.limit.currency().code(),
        "charged": false,
    })
    .to_string()
}

/// The budget refusal a journaled charge result records, if it is one.
fn budget_refusal(content: &str, ctx: &OperationContext) -> Option<BudgetLeft> {
    let result: serde_json::Value = serde_json::from_str(content).ok()?;
    let left = result.get("budgetLeft")?.as_str()?;
    let limit = ctx.charge().budget()?;
    let minor = match crate::payments::Money::parse(left, limit.currency()) {
        Ok(money) => money.minor(),
        Err(_) => 0,
    };
    Some(BudgetLeft { minor, limit })
}

/// A refused charge call: what was wrong, and the call that would be accepted (the
/// authorized values are in the prompt already; naming them reveals nothing).
fn refused_charge(refusal: &ArgumentRefusal, order: &Order) -> ToolOutput {
    let reason = refusal.reason(order);
    tracing::info!(%reason, "charge call refused");
    let content = json!({
        "status": "error",
        "error": format!("{reason}; nothing was charged"),
        "acceptedCall": {"name": CHARGE, "arguments": accepted_arguments(order)},
    });
    ToolOutput {
        content: content.to_string(),
        receipt: None,
        journaled: false,
    }
}

/// The arguments of the one charge call this checkout accepts.
pub(crate) fn accepted_arguments(order: &Order) -> serde_json::Value {
    json!({"orderId": order.id().as_str(), "amount": order.amount().decimal()})
}

fn refused(reason: String) -> ToolOutput {
    tracing::info!(%reason, "tool call refused");
    ToolOutput {
        content: json!({"status": "error", "error": reason}).to_string(),
        receipt: None,
        journaled: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payments::{Currency, Money, OrderId};

    #[test]
    fn a_refused_charge_says_what_was_wrong_and_which_call_is_accepted() {
        let usd = Currency::parse("USD").unwrap();
        #[allow(
            clippy::disallowed_methods,
            reason = "a test's fixed order, not a request's"
        )]
        let order = Order::new(
            OrderId::parse("X.1:2").unwrap(),
            Money::parse("42.50", usd).unwrap(),
        );
        let refusal = ChargeArguments::parse(r#"{"orderId": "X.1", "amount": "42.50 USD"}"#)
            .and_then(|args| args.check(&order))
            .unwrap_err();
        let output = refused_charge(&refusal, &order);
        assert!(output.receipt.is_none());
        let content: serde_json::Value = serde_json::from_str(&output.content).unwrap();
        assert_eq!(
            content,
            json!({
                "status": "error",
                "error": "orderId \"X.1\" is not the order being checked out; the order id is \"X.1:2\", written exactly as given; nothing was charged",
                "acceptedCall": {"name": "charge", "arguments": {"orderId": "X.1:2", "amount": "42.50"}},
            })
        );
    }
}
