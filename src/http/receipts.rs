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
use crate::http::views::ReceiptView;
use crate::payments::OrderId;
use crate::payments::Receipt;

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
