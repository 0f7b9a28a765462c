//! The bodies several endpoints share (a receipt, a refund, what an operation cost), as
//! the API shows them: one place each, so that every answer that carries one agrees.

use serde::Serialize;
use utoipa::ToSchema;

use crate::assistant::Usage;
use crate::payments::Receipt;
use crate::payments::store::Refund;
use crate::payments::store::budgets::Crossing;

/// A receipt as the API shows it.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReceiptView {
    #[schema(example = "0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f")]
    pub id: String,
    #[schema(example = "A-100")]
    pub order_id: String,
    #[schema(example = "42.50")]
    pub amount: String,
    #[schema(example = "USD")]
    pub currency: String,
    /// RFC 3339, UTC.
    #[schema(example = "2026-12-02T18:37:03.123456Z")]
    pub created_at: String,
    /// The payment provider's id of the charge (Stripe's `pi_…`); absent for the ledger.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "pi_3MtwBwLkdIwHu7ix28a3tqPa")]
    pub payment_id: Option<String>,
    /// What is refunded of the charge (`POST /refunds`), `0.00` when nothing is; in a
    /// checkout's answer, absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "20.00")]
    pub refunded_amount: Option<String>,
    /// The order's refunds, oldest first (`GET /receipts/{orderId}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refunds: Option<Vec<RefundView>>,
}

impl From<&Receipt> for ReceiptView {
    fn from(receipt: &Receipt) -> Self {
        ReceiptView {
            id: receipt.id.to_string(),
            order_id: receipt.order_id.to_string(),
            amount: receipt.amount.decimal(),
            currency: receipt.amount.currency().code().to_owned(),
            created_at: receipt
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            payment_id: receipt.provider_payment_id.clone(),
            refunded_amount: None,
            refunds: None,
        }
    }
}

/// A refund, as the API shows it.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefundView {
    #[schema(example = "0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e70")]
    pub id: String,
    #[schema(example = "20.00")]
    pub amount: String,
    #[schema(example = "USD")]
    pub currency: String,
    /// RFC 3339, UTC.
    #[schema(example = "2026-12-02T18:40:03.123456Z")]
    pub created_at: String,
    /// `succeeded`; with a payment provider `pending` while it is asked.
    #[schema(example = "succeeded")]
    pub status: &'static str,
    /// The payment provider's id of the refund (Stripe's `re_…`); absent for the ledger.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_refund_id: Option<String>,
    /// The refund's reason, as the request gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<&Refund> for RefundView {
    fn from(refund: &Refund) -> Self {
        RefundView {
            id: refund.id.to_string(),
            amount: refund.amount.decimal(),
            currency: refund.amount.currency().code().to_owned(),
            created_at: refund
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            status: refund.status.as_str(),
            provider_refund_id: refund.provider_refund_id.clone(),
            reason: refund.reason.clone(),
        }
    }
}

/// What the checkout cost the model provider, and what resuming from the journal saved.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageView {
    /// Chat-completions requests this operation sent (retries included; none for steps
    /// replayed from the journal).
    #[schema(example = 2)]
    pub model_requests: u32,
    /// Model answers and tool results taken from the journal instead of run again (a
    /// retry that resumed).
    #[schema(example = 0)]
    pub replayed_steps: u32,
    /// Input (prompt) tokens of the answers received, as the provider reported them.
    #[schema(example = 412)]
    pub input_tokens: u64,
    /// Output (completion) tokens, as the provider reported them.
    #[schema(example = 57)]
    pub output_tokens: u64,
    /// The models that answered (a fallback's too; replayed answers count), in order of
    /// first use.
    #[schema(example = json!(["gpt-4o-mini"]))]
    pub models: Vec<String>,
}

impl From<Usage> for UsageView {
    fn from(usage: Usage) -> Self {
        UsageView {
            model_requests: usage.model_requests,
            replayed_steps: usage.replayed_steps,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            models: Vec::new(),
        }
    }
}

/// `charge.succeeded`'s `data`: the receipt as the API shows it, and its id as `receiptId`.
pub(crate) fn charge_event(receipt: &Receipt) -> serde_json::Value {
    let mut data = serde_json::to_value(ReceiptView::from(receipt)).expect("a view serializes");
    data["receiptId"] = receipt.id.to_string().into();
    data["operationKey"] = receipt.operation_key.clone().into();
    data
}

/// `refund.succeeded`'s `data`: the refund as the API shows it, with its order.
pub(crate) fn refund_event(refund: &Refund) -> serde_json::Value {
    let mut data = serde_json::to_value(RefundView::from(refund)).expect("a view serializes");
    data["orderId"] = refund.order_id.to_string().into();
    data["operationKey"] = refund.operation_key.clone().into();
    data
}

/// `budget.threshold`'s `data`: a caller's day crossing a share of its budget, amounts as
/// the API shows them (decimals in the budget's currency, as `budgetLeft`).
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetThresholdView {
    #[schema(example = "shop-assistant")]
    pub caller: String,
    /// The UTC day.
    #[schema(example = "2026-12-07")]
    pub day: String,
    /// Per cent of the budget crossed: 80 or 100.
    #[schema(example = 80)]
    pub threshold: u8,
    /// The day's budget.
    #[schema(example = "100.00")]
    pub budget: String,
    /// What the day's charges came to, the crossing one included.
    #[schema(example = "85.00")]
    pub spent: String,
    #[schema(example = "USD")]
    pub currency: String,
}

impl From<&Crossing> for BudgetThresholdView {
    fn from(c: &Crossing) -> Self {
        let day = chrono::DateTime::from_timestamp(c.day.saturating_mul(86_400), 0)
            .map_or_else(|| c.day.to_string(), |d| d.date_naive().to_string());
        BudgetThresholdView {
            caller: c.caller.clone(),
            day,
            threshold: c.threshold,
            budget: c.budget.decimal(),
            spent: c.spent.decimal(),
            currency: c.budget.currency().code().to_owned(),
        }
    }
}

/// `budget.threshold`'s `data`.
pub(crate) fn budget_event(crossing: &Crossing) -> serde_json::Value {
    serde_json::to_value(BudgetThresholdView::from(crossing)).expect("a view serializes")
}
