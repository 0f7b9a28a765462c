//! What a refund request says: the order, an optional amount (default: what is left of
//! its charge) and reason, as query parameters or as a JSON body, once.

use axum::body::Bytes;
use axum::extract::{FromRequest, Query, Request};
use axum::http::{StatusCode, header};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use crate::http::error::{Code, Problem};
use crate::outbox::Recipient;
use crate::payments::OrderId;

/// The longest reason kept (characters).
pub const MAX_REASON: usize = 500;

/// A refund, as query parameters or as a JSON body with the same names.
#[derive(Debug, Default, Deserialize, IntoParams, ToSchema)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RefundQuery {
    /// The order to refund: one this caller charged (any order with the scope `read`).
    #[param(
        required = true,
        example = "A-100",
        min_length = 1,
        max_length = 64,
        pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
    )]
    #[schema(example = "A-100")]
    #[serde(rename = "orderId")]
    pub order_id: Option<String>,
    /// The amount to give back, a decimal > 0 in the charge's currency; when not given,
    /// what is left of the charge.
    #[param(schema_with = crate::http::schema::amount)]
    #[schema(example = "20.00")]
    pub amount: Option<String>,
    /// Why, for the records (at most 500 characters); the model never sees it.
    #[param(example = "damaged in transit", max_length = 500)]
    #[schema(example = "damaged in transit")]
    pub reason: Option<String>,
    /// Where to confirm the refund; when not given, the address the order's checkout
    /// confirmed its payment to, if it had one.
    // The address's schema, both its patterns (the 64 characters before the `@` too), as
    // POST /checkout's: from the parser's constants.
    #[param(schema_with = crate::http::schema::email)]
    #[schema(example = "ann@example.com")]
    pub email: Option<String>,
}

/// The input, from the query string or (not both) a JSON body.
pub struct RefundInput(pub RefundQuery);

impl<S: Send + Sync> FromRequest<S> for RefundInput {
    type Rejection = Problem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Problem> {
        let query = request.uri().query().unwrap_or_default().to_owned();
        let json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        let body = Bytes::from_request(request, state).await.map_err(|err| {
            if err.status() == StatusCode::PAYLOAD_TOO_LARGE {
                return Problem::new(
                    Code::ContentTooLarge,
                    "the request body is larger than this service takes; nothing was run or recorded",
                );
            }
            Problem::invalid("body", format!("cannot read the body: {}", err.body_text()))
        })?;
        if body.is_empty() {
            let Query(params) = Query::<RefundQuery>::try_from_uri(
                &format!("/?{query}").parse().expect("a path and query"),
            )
            .map_err(|err| Problem::invalid("query", err.body_text()))?;
            return Ok(RefundInput(params));
        }
        if !query.is_empty() {
            return Err(Problem::invalid(
                "body",
                "give the refund once: as query parameters or as a JSON body, not both; nothing was run or recorded",
            ));
        }
        if !json {
            return Err(Problem::invalid(
                "body",
                "a body must be JSON (Content-Type: application/json); nothing was run or recorded",
            ));
        }
        serde_json::from_slice(&body)
            .map(RefundInput)
            .map_err(|err| Problem::invalid("body", format!("the body does not read: {err}")))
    }
}

/// The order id, the amount as written, the reason and the address, checked in form.
pub(super) struct Checked {
    pub order_id: OrderId,
    pub amount: Option<String>,
    pub reason: Option<String>,
    pub email: Option<Recipient>,
}

pub(super) fn check(query: RefundQuery) -> Result<Checked, Problem> {
    let order_id = query
        .order_id
        .ok_or_else(|| Problem::invalid("orderId", "orderId is required"))?;
    let order_id = OrderId::parse(&order_id)
        .map_err(|err| Problem::invalid("orderId", format!("orderId {err}")))?;
    let reason = query
        .reason
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty());
    if reason
        .as_ref()
        .is_some_and(|r| r.chars().count() > MAX_REASON)
    {
        return Err(Problem::invalid(
            "reason",
            format!("reason has more than {MAX_REASON} characters"),
        ));
    }
    let email = query
        .email
        .map(|text| {
            Recipient::parse(&text).map_err(|err| Problem::invalid("email", format!("email {err}")))
        })
        .transpose()?;
    Ok(Checked {
        order_id,
        amount: query.amount,
        reason,
        email,
    })
}
