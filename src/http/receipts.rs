//! `GET /receipts/{orderId}`.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};

use super::error::{Code, Problem, ProblemBody};
use super::{AppState, ReceiptView};
use crate::payments::OrderId;

#[utoipa::path(
    get,
    path = "/receipts/{orderId}",
    tag = "checkout",
    summary = "The receipt of a charged order",
    params(("orderId" = String, Path, description = "The order id", example = "A-100")),
    responses(
        (status = 200, description = "The order is charged", body = ReceiptView),
        (status = 400, description = "`invalid_request`: not a valid order id", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: the order has not been charged", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "`unavailable`: the database could not be reached", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub async fn get_receipt(State(app): State<AppState>, Path(order_id): Path<String>) -> Response {
    let order_id = match OrderId::parse(&order_id) {
        Ok(id) => id,
        Err(err) => return Problem::invalid("orderId", format!("orderId {err}")).into_response(),
    };
    match app.gateway().receipt(&order_id).await {
        Ok(Some(receipt)) => axum::Json(ReceiptView::from(&receipt)).into_response(),
        Ok(None) => Problem::new(
            Code::NotFound,
            format!("order {order_id} has no receipt: it has not been charged"),
        )
        .into_response(),
        Err(err) => Problem::new(Code::Unavailable, format!("cannot read the receipt: {err}"))
            .retry_after(1)
            .into_response(),
    }
}
