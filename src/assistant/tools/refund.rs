//! The `refund` tool, offered instead of `charge` on a refund operation (`POST /refunds`):
//! its arguments checked against the refund the handler authorized (lenient in form,
//! strict in value, as `charge`'s), then the gateway refunds the context's order and
//! amount under the operation's key. And the refund's confirmation email.

use std::sync::LazyLock;

use serde_json::json;

use super::{ToolBox, ToolOutput, raw, refused};
use crate::assistant::arguments::{ArgumentRefusal, ChargeArguments};
use crate::assistant::context::OperationContext;
use crate::assistant::error::{FailureKind, JournalFailure, ToolFailure};
use crate::journal::NewEntry;
use crate::model::wire::{FunctionSpec, ToolCall, ToolList, ToolSpec, Tools};
use crate::payments::gateway::{RefundError, RefundMade};
use crate::payments::store::{Refund, Refunded};
use crate::payments::{Order, Receipt};
use crate::telemetry::genai;

pub const REFUND: &str = "refund";

/// The tools of a refund: `refund`, and `send_confirmation` when the request named an
/// address.
pub(super) fn offered(confirmation: bool) -> Tools {
    static SPECS: LazyLock<ToolList> = LazyLock::new(|| {
        ToolList::new(vec![ToolSpec {
            kind: "function".into(),
            function: FunctionSpec {
                name: REFUND.into(),
                description: "Refunds the customer an amount of an order's payment. Calling it again for the same request does not refund twice.".into(),
                parameters: raw(json!({
                    "type": "object",
                    "properties": {
                        "orderId": {"type": "string", "description": "the order id"},
                        "amount": {"type": "number", "description": "the amount to refund"}
                    },
                    "required": ["orderId", "amount"],
                    "additionalProperties": false
                })),
            },
        }])
    });
    static WITH_CONFIRMATION: LazyLock<ToolList> = LazyLock::new(|| {
        let mut specs = offered(false).to_vec();
        specs.push(ToolSpec {
            kind: "function".into(),
            function: FunctionSpec {
                name: super::SEND_CONFIRMATION.into(),
                description: "Sends the customer the email confirming this refund, after it is made. Takes no arguments: the service writes the message from the refund. Calling it again sends nothing more.".into(),
                parameters: raw(json!({
                    "type": "object",
                    "properties": {},
                    "additionalProperties": false
                })),
            },
        });
        ToolList::new(specs)
    });
    Tools::Offered(if confirmation {
        &WITH_CONFIRMATION
    } else {
        &SPECS
    })
}

impl ToolBox {
    /// A tool call of a refund operation.
    pub(super) async fn run_refund(
        &self,
        ctx: &OperationContext,
        call: &ToolCall,
        journal: Option<impl FnOnce(String) -> Vec<NewEntry>>,
    ) -> Result<ToolOutput, ToolFailure> {
        let name = call.function.name.as_str();
        if name == super::SEND_CONFIRMATION && ctx.email().is_some() {
            return self.confirm_refund(ctx).await;
        }
        if name != REFUND {
            return Ok(refused(format!(
                "there is no tool {name:?}; call {REFUND:?}{}",
                if ctx.email().is_some() {
                    " and then \"send_confirmation\""
                } else {
                    ""
                }
            )));
        }
        let order = ctx.order();
        if let Err(refusal) =
            ChargeArguments::parse(&call.function.arguments).and_then(|args| args.check(order))
        {
            return Ok(refused_refund(&refusal, order));
        }
        if ctx.needs_approval() {
            self.approved(ctx).await?;
        }
        let doubt_before = ctx.effect_sending();
        let mut journaled = false;
        let made = self
            .gateway
            .refund(&ctx.refund(), |made| {
                let Some(journal) = journal else {
                    return Vec::new();
                };
                let entries = journal(refund_result(made, false));
                journaled = !entries.is_empty();
                entries
            })
            .await;
        let RefundMade {
            refund,
            created,
            journaled: committed,
        } = match made {
            Ok(made) => made,
            Err(RefundError::Exceeds { state, .. }) => {
                ctx.effect_not_sent(doubt_before);
                return Ok(self.refund_refused(ctx, Some(state)));
            }
            Err(RefundError::NotCharged(_)) => {
                ctx.effect_not_sent(doubt_before);
                return Ok(self.refund_refused(ctx, None));
            }
            Err(err) => {
                if !matches!(&err, RefundError::Store(store) if !store.never_sent()) {
                    ctx.effect_not_sent(doubt_before);
                }
                return Err(ToolFailure::Refund(Box::new(err)));
            }
        };
        self.metrics.refund(
            if created { "refunded" } else { "found" },
            refund.amount.currency().code(),
            u64::try_from(refund.amount.minor()).unwrap_or(0),
        );
        if created {
            tracing::info!(target: genai::TARGET, order = %refund.order_id, refund = %refund.id, "refund tool: refunded");
        } else {
            tracing::info!(order = %refund.order_id, refund = %refund.id, "refund tool: this operation's refund was made before; returning it, refunding nothing");
        }
        ctx.record_refund(&refund, created);
        let receipt = self.receipt_of(ctx).await.map_err(|err| {
            ToolFailure::Refund(Box::new(RefundError::Store(match err {
                FailureKind::Journal(JournalFailure::Store(err)) => err,
                other => crate::db::StoreError::Corrupt(other.to_string()),
            })))
        })?;
        Ok(ToolOutput {
            content: refund_result(&refund, !created),
            receipt: Some(receipt),
            journaled: journaled && committed,
        })
    }

    /// The order's receipt, which a refund was made against.
    async fn receipt_of(&self, ctx: &OperationContext) -> Result<Receipt, FailureKind> {
        Box::pin(self.gateway.receipt(ctx.order().id()))
            .await
            .map_err(|err| FailureKind::Journal(JournalFailure::Store(err)))?
            .ok_or_else(|| {
                FailureKind::Journal(JournalFailure::Store(crate::db::StoreError::Corrupt(
                    format!("order {} has a refund and no receipt", ctx.order().id()),
                )))
            })
    }

    /// A refund refused: it would pass what the order was charged (what is left in
    /// `state`), or the order is not charged. The model is told; nothing was refunded.
    fn refund_refused(&self, ctx: &OperationContext, state: Option<Refunded>) -> ToolOutput {
        self.metrics.refund_refused();
        ctx.refund_refused(state);
        let order = ctx.order();
        let content = match state {
            Some(state) => json!({
                "status": "error",
                "error": format!(
                    "refunding {} would pass what order {} was charged: {} {} is left to refund; nothing was refunded; do not call {REFUND:?} again, tell the customer",
                    order.amount(), order.id(), state.left_decimal(), state.charged.currency()
                ),
                "refundLeft": state.left_decimal(),
                "currency": state.charged.currency().code(),
                "refunded": false,
            }),
            None => json!({
                "status": "error",
                "error": format!("order {} is not charged: there is nothing to refund; do not call {REFUND:?} again, tell the customer", order.id()),
                "refundLeft": "0",
                "refunded": false,
            }),
        };
        tracing::info!(order = %order.id(), "refund tool: refused, nothing refunded");
        ToolOutput {
            content: content.to_string(),
            receipt: None,
            journaled: false,
        }
    }

    /// `send_confirmation` of a refund: one outbox row for this operation, written only
    /// once this operation's refund is made.
    async fn confirm_refund(&self, ctx: &OperationContext) -> Result<ToolOutput, ToolFailure> {
        let Some((refund, _)) = ctx.refund_made() else {
            return Ok(refused(format!(
                "the refund is not made yet: call {REFUND:?} first; nothing was sent"
            )));
        };
        let email = ctx.email().expect("offered only with an address");
        let key = ctx.journal_key();
        let queued = Box::pin(self.outbox.queue_refund_confirmation(
            &key.caller,
            &key.operation_key,
            email,
            &refund,
        ))
        .await?;
        tracing::info!(target: genai::TARGET, order = %refund.order_id, message_id = %queued.message_id, status = %queued.status, "send_confirmation tool: the refund's confirmation is in the outbox");
        Ok(ToolOutput {
            content: json!({
                "status": queued.status,
                "messageId": queued.message_id,
                "orderId": refund.order_id.as_str(),
            })
            .to_string(),
            receipt: None,
            journaled: false,
        })
    }

    /// A journaled result of a refund call: the refund it names is read back (by the
    /// operation's key); a result naming a refund the operation does not have is a
    /// mismatch, never replayed.
    pub(super) async fn replayed_refund(
        &self,
        ctx: &OperationContext,
        step: i64,
        content: String,
    ) -> Result<ToolOutput, FailureKind> {
        let result: serde_json::Value = serde_json::from_str(&content).unwrap_or_default();
        if result["status"] != "refunded" {
            if let Some(left) = result.get("refundLeft") {
                let state = self.refunded(ctx).await?;
                let _ = left;
                ctx.refund_refused(state);
            }
            return Ok(ToolOutput {
                content,
                receipt: None,
                journaled: true,
            });
        }
        let id = result["refundId"].as_str().unwrap_or_default();
        let key = ctx.journal_key();
        let refund = self
            .gateway
            .refunds()
            .by_operation(&key.caller, &key.operation_key)
            .await
            .map_err(|err| FailureKind::Journal(JournalFailure::Store(err)))?
            .filter(|refund| refund.id.to_string() == id)
            .ok_or_else(|| JournalFailure::Mismatch {
                step,
                detail: format!(
                    "the journaled refund names refund {id}, which this operation does not have"
                ),
            })?;
        ctx.record_refund(&refund, false);
        let receipt = self.receipt_of(ctx).await?;
        Ok(ToolOutput {
            content,
            receipt: Some(receipt),
            journaled: true,
        })
    }

    async fn refunded(&self, ctx: &OperationContext) -> Result<Option<Refunded>, FailureKind> {
        self.gateway
            .refunds()
            .refunded(ctx.order().id())
            .await
            .map_err(|err| FailureKind::Journal(JournalFailure::Store(err)))
    }
}

/// What the model is told of a refund.
fn refund_result(refund: &Refund, already_refunded: bool) -> String {
    json!({
        "status": "refunded",
        "orderId": refund.order_id.as_str(),
        "amount": refund.amount.decimal(),
        "currency": refund.amount.currency().code(),
        "refundId": refund.id.to_string(),
        "alreadyRefunded": already_refunded,
    })
    .to_string()
}

/// A refused refund call: what was wrong, and the call that would be accepted.
fn refused_refund(refusal: &ArgumentRefusal, order: &Order) -> ToolOutput {
    let reason = refusal.reason(order);
    tracing::info!(%reason, "refund call refused");
    let content = json!({
        "status": "error",
        "error": format!("{reason}; nothing was refunded"),
        "acceptedCall": {"name": REFUND, "arguments": super::accepted_arguments(order)},
    });
    ToolOutput {
        content: content.to_string(),
        receipt: None,
        journaled: false,
    }
}
