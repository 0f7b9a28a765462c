//! `GET /receipts/{orderId}`.

use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};

use std::collections::BTreeMap;

use utoipa::IntoResponses;
use utoipa::openapi::{RefOr, Response as DocResponse};

use super::error::{Code, Problem, documented};
use super::schema;
use super::state::AppState;
use crate::caller::{AuthRefusal, Caller, Scope};
use crate::payments::OrderId;
use crate::payments::Receipt;
use serde::Serialize;
use utoipa::ToSchema;

pub struct ReceiptErrors;

impl IntoResponses for ReceiptErrors {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        documented([
            (
                "`invalid_request`: not a valid order id",
                vec![Problem::invalid(
                    "orderId",
                    "orderId must start with a letter or a digit",
                )],
            ),
            (
                "`unauthorized`: no valid API key (see WWW-Authenticate)",
                vec![Problem::unauthorized(AuthRefusal::Missing)],
            ),
            (
                "`not_found`: the order has not been charged, or by another caller (and this key lacks the scope `read`)",
                vec![Problem::new(
                    Code::NotFound,
                    "order A-100 has no receipt: it has not been charged",
                )],
            ),
            (
                "`unavailable`: the database could not be reached",
                vec![unavailable(
                    "pool timed out while waiting for an open connection",
                )],
            ),
        ])
    }
}

fn unavailable(err: impl std::fmt::Display) -> Problem {
    Problem::unavailable(format!("cannot read the receipt: {err}"))
}

#[utoipa::path(
    get,
    path = "/receipts/{orderId}",
    tag = "checkout",
    summary = "The receipt of a charged order",
    description = "A caller reads the receipts of its own checkouts; with the API key scope `read`, every caller's. Another caller's receipt is 404, as an order not charged.",
    security(("api_key" = ["checkout"]), ("api_key" = ["read"])),
    params(("orderId" = inline(schema::OrderIdText), Path, description = schema::ORDER_ID, example = "A-100")),
    responses(
        (status = 200, description = "The order is charged", body = ReceiptView),
        ReceiptErrors,
    )
)]
pub async fn get_receipt(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(order_id): Path<String>,
) -> Response {
    let order_id = match OrderId::parse(&order_id) {
        Ok(id) => id,
        Err(err) => return Problem::invalid("orderId", format!("orderId {err}")).into_response(),
    };
    // Another caller's receipt is as good as none: a 403 would say the order exists.
    let readable = |r: &Receipt| r.caller == caller.name || caller.has(Scope::Read);
    match app.gateway().receipt(&order_id).await {
        Ok(Some(receipt)) if readable(&receipt) => {
            let mut view = ReceiptView::from(&receipt);
            let refunds = app.gateway().refunds();
            let (state, made) = match (
                refunds.refunded(&order_id).await,
                refunds.of_order(&order_id).await,
            ) {
                (Ok(state), Ok(made)) => (state, made),
                (Err(err), _) | (_, Err(err)) => return unavailable(err).into_response(),
            };
            view.refunded_amount = state.map(|s| s.refunded_decimal());
            view.refunds = Some(made.iter().map(Into::into).collect());
            axum::Json(view).into_response()
        }
        Ok(_) => Problem::new(
            Code::NotFound,
            format!("order {order_id} has no receipt: it has not been charged"),
        )
        .into_response(),
        Err(err) => unavailable(err).into_response(),
    }
}

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
    pub refunds: Option<Vec<crate::http::refunds::RefundView>>,
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
