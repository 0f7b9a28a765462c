//! `POST /checkout`: validate, make the keys, run the assistant, answer.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use super::error::{Code, Problem, ProblemBody};
use super::{Answer, AppState, ReceiptView, idempotent};
use crate::assistant::{CheckoutContext, CheckoutError, CheckoutOutcome, FailureKind, LoopStop};
use crate::caller::Caller;
use crate::model::{ModelErrorKind, Stop};
use crate::payments::money::json_decimal;
use crate::payments::{Currency, Money, OperationKey, Order, OrderId};

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The order to charge, as query parameters (as in the article:
/// `POST /checkout?orderId=A-100&amount=42.50`).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct CheckoutQuery {
    /// The order id: 1–64 of `A-Z a-z 0-9 . _ : -`, starting with a letter or digit.
    /// Required here or in the JSON body.
    #[param(example = "A-100")]
    #[serde(rename = "orderId")]
    order_id: Option<String>,
    /// The amount, a decimal > 0 with at most the currency's minor digits.
    /// Required here or in the JSON body.
    #[param(example = "42.50")]
    amount: Option<String>,
    /// ISO 4217 code; `USD` when not given.
    #[param(example = "USD")]
    currency: Option<String>,
}

/// The order to charge, as a JSON body (instead of, or agreeing with, the query).
#[derive(ToSchema)]
#[schema(example = json!({"orderId": "A-100", "amount": "42.50", "currency": "USD"}))]
#[allow(dead_code)]
pub struct CheckoutBody {
    /// The order id: 1–64 of `A-Z a-z 0-9 . _ : -`, starting with a letter or digit.
    #[schema(rename = "orderId", example = "A-100")]
    order_id: String,
    /// The amount as a decimal string (`"42.50"`) or a JSON number (`42.50`), read exactly.
    #[schema(example = "42.50")]
    amount: String,
    /// ISO 4217 code; `USD` when not given.
    #[schema(example = "USD")]
    currency: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BodyFields {
    #[serde(rename = "orderId")]
    order_id: Option<String>,
    amount: Option<Box<RawValue>>,
    currency: Option<String>,
}

/// A confirmed checkout.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckoutResponse {
    #[schema(example = "A-100")]
    pub order_id: String,
    #[schema(example = "42.50")]
    pub amount: String,
    #[schema(example = "USD")]
    pub currency: String,
    /// The assistant's one-sentence confirmation.
    pub message: String,
    pub receipt: ReceiptView,
    /// True when this operation made the charge; false when the order had been charged
    /// by an earlier operation and its receipt is returned instead.
    pub charged: bool,
    /// Runs of the assistant loop it took (more than 1 when the loop retry stepped in).
    #[schema(example = 1)]
    pub attempts: u32,
    /// The `Idempotency-Key` sent, or the UUIDv7 minted for this operation.
    pub operation_key: String,
}

#[utoipa::path(
    post,
    path = "/checkout",
    tag = "checkout",
    summary = "Charge an order through the checkout assistant",
    description = "Runs the assistant loop: the model calls the `charge` tool, the gateway charges the order once (keyed by the order id), the model confirms. Give the order as query parameters or as a JSON body; a field given in both must agree. Send `Accept: text/plain` for the confirmation sentence alone.",
    params(
        CheckoutQuery,
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried POST safe to send: the same key with the same order replays the first answer. A structured-field string (`\"k-1\"`) or a bare token, 1–255 printable ASCII characters."),
    ),
    request_body(
        content = Option<CheckoutBody>,
        content_type = "application/json",
        description = "The order, instead of query parameters. An empty object (or no body) leaves the query parameters to say it.",
        examples(
            ("query parameters only" = (summary = "The order is in the query parameters", value = json!({}))),
            ("the order in the body" = (summary = "The order as a JSON body", value = json!({"orderId": "A-100", "amount": "42.50", "currency": "USD"}))),
        )
    ),
    responses(
        (status = 200, description = "The order is charged (now, or by an earlier operation)", content(
            (CheckoutResponse = "application/json"),
            (String = "text/plain", example = "Your payment of 42.50 USD for order A-100 went through; your receipt is 0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f.")
        )),
        (status = 400, description = "Invalid input (`invalid_request`, with `field`); nothing was charged", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`amount_conflict`: the order was charged another amount; or `in_flight`: the same Idempotency-Key is still running (see Retry-After)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "`key_reuse`: the Idempotency-Key was used with another order or amount", body = ProblemBody, content_type = "application/problem+json"),
        (status = 502, description = "`model_error`: the model provider failed after retries; `model_did_not_charge`: the model finished without charging", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "`unavailable`: the database could not be reached (see Retry-After)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 504, description = "`deadline_exceeded`: the checkout timed out after retries", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub async fn checkout(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    query: Result<Query<CheckoutQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // The request is read whole before anything waits: the headers and the body are
    // dropped here, not held for the seconds the model takes.
    let (order, client_key, format) =
        match read_request(&headers, query, body, app.settings().payments.max_amount) {
            Ok(parts) => parts,
            Err(problem) => return problem.into_response(),
        };
    drop(headers);
    match client_key {
        Some(key) => {
            let scope = caller.map(|Extension(c)| c.0).unwrap_or_default();
            // Boxed, like the failure path below: a handler future is as large as its
            // largest branch, and thousands of checkouts wait at once.
            Box::pin(idempotent::checkout(app, scope, key, order, format)).await
        }
        None => {
            let operation_key = OperationKey::mint();
            idempotent::detached(async move { run(&app, order, operation_key, format).await })
                .await
                .into_response()
        }
    }
}

/// The order, the client's Idempotency-Key and the answer's format, or the 400.
fn read_request(
    headers: &HeaderMap,
    query: Result<Query<CheckoutQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
    max_amount: u64,
) -> Result<(Order, Option<OperationKey>, Format), Problem> {
    let body = body.map_err(|err| {
        Problem::invalid("body", format!("cannot read the body: {}", err.body_text()))
    })?;
    let order = read_order(headers, query, &body, max_amount)?;
    let client_key = idempotency_key(headers)?;
    Ok((order, client_key, Format::from_accept(headers)))
}

/// Runs one checkout to its answer. Everything retried happens inside `assistant`.
pub(crate) async fn run(
    app: &AppState,
    order: Order,
    operation_key: OperationKey,
    format: Format,
) -> Answer {
    let ctx = CheckoutContext::new(order, operation_key);
    match app.assistant().checkout(ctx.clone()).await {
        Ok(outcome) => success(&ctx, outcome, format),
        Err(err) => Box::pin(failure(app, &ctx, err)).await.answer(),
    }
}

fn success(ctx: &CheckoutContext, outcome: CheckoutOutcome, format: Format) -> Answer {
    tracing::info!(
        order = %ctx.order().id(),
        receipt = %outcome.receipt.id,
        charged = outcome.charged,
        attempts = outcome.attempts,
        "checkout confirmed"
    );
    match format {
        Format::Text => Answer::new(StatusCode::OK, "text/plain; charset=utf-8", outcome.message),
        Format::Json => {
            let amount = ctx.order().amount();
            let body = CheckoutResponse {
                order_id: ctx.order().id().to_string(),
                amount: amount.decimal(),
                currency: amount.currency().code().to_owned(),
                message: outcome.message,
                receipt: ReceiptView::from(&outcome.receipt),
                charged: outcome.charged,
                attempts: outcome.attempts,
                operation_key: ctx.operation_key().to_string(),
            };
            Answer::json(StatusCode::OK, &body)
        }
    }
}

/// The error answer, saying which layer gave up and whether the order is charged.
async fn failure(app: &AppState, ctx: &CheckoutContext, err: CheckoutError) -> Problem {
    let layer = if err.stop == Some(LoopStop::RetriesSpent) {
        Some("loop retry")
    } else {
        match err.kind {
            FailureKind::Model(_) => Some("request retry"),
            FailureKind::Timeout(_) => Some("loop timeout"),
            _ => None,
        }
    };
    let mut problem = match &err.kind {
        FailureKind::AmountConflict { existing, .. } => {
            return Problem::new(
                Code::AmountConflict,
                format!("{}; nothing was charged", err.kind),
            )
            .with("orderCharged", true)
            .with("receiptId", existing.id.to_string())
            .with("chargedAmount", existing.amount.decimal())
            .with("chargedCurrency", existing.amount.currency().code());
        }
        FailureKind::Model(model) => {
            let code = match model.kind {
                ModelErrorKind::Timeout(_) if model.stop == Some(Stop::RetriesSpent) => {
                    Code::DeadlineExceeded
                }
                _ => Code::ModelError,
            };
            let mut problem =
                Problem::new(code, err.to_string()).with("requestAttempts", model.attempts);
            if let Some(status) = model.kind.upstream_status() {
                problem = problem.with("upstreamStatus", status);
            }
            if let Some(wait) = model.kind.retry_after() {
                // The provider said when it will take requests again; so do we.
                problem = problem.retry_after(wait.as_secs().max(1));
            }
            problem
        }
        FailureKind::ModelDidNotCharge => Problem::new(Code::ModelDidNotCharge, err.to_string()),
        FailureKind::TooManyRounds(_) => Problem::new(Code::ModelError, err.to_string()),
        FailureKind::Store(_) => Problem::new(Code::Unavailable, err.to_string()).retry_after(1),
        FailureKind::Timeout(_) => Problem::new(Code::DeadlineExceeded, err.to_string()),
    };
    problem = problem.with("attempts", err.attempts);
    if let Some(layer) = layer {
        problem = problem.with("layer", layer);
    }
    tracing::warn!(order = %ctx.order().id(), error = %err, cause = ?std::error::Error::source(&err), "checkout failed");
    // The truth about the charge comes from the database, read outside the retried
    // unit: an attempt cut off by a timeout may have committed its charge unseen.
    let op = ctx.operation_key().as_str();
    let (order_charged, charged, note, receipt_id) = match app
        .gateway()
        .receipt(ctx.order().id())
        .await
    {
        Ok(Some(receipt)) => (
            Some(true),
            Some(receipt.operation_key == op),
            format!(
                "order {} is charged (receipt {})",
                receipt.order_id, receipt.id
            ),
            Some(receipt.id),
        ),
        Ok(None) => (
            Some(false),
            Some(false),
            "the order was not charged".to_owned(),
            None,
        ),
        Err(lookup) => {
            tracing::warn!(error = %lookup, "cannot ask the database whether the order is charged");
            match ctx.charge_known() {
                Some(Some(receipt)) => (
                    Some(true),
                    Some(true),
                    format!("this checkout charged order {} (receipt {})", receipt.order_id, receipt.id),
                    Some(receipt.id),
                ),
                Some(None) => (
                    None,
                    Some(false),
                    "this checkout charged nothing: none of its charge statements reached the database".to_owned(),
                    None,
                ),
                None => (
                    None,
                    None,
                    format!(
                        "whether order {} was charged is unknown until the database answers (GET /receipts/{})",
                        ctx.order().id(),
                        ctx.order().id()
                    ),
                    None,
                ),
            }
        }
    };
    problem.detail = format!("{}; {note}", problem.detail);
    if let Some(id) = receipt_id {
        problem = problem.with("receiptId", id.to_string());
    }
    problem
        .with("orderCharged", order_charged)
        .with("charged", charged)
}

/// JSON unless the client prefers `text/plain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Text,
}

impl Format {
    pub fn from_accept(headers: &HeaderMap) -> Format {
        let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
            return Format::Json;
        };
        let (mut json, mut text) = (0.0_f32, 0.0_f32);
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let q = parts
                .find_map(|p| p.strip_prefix("q="))
                .and_then(|q| q.parse::<f32>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/json" | "application/*" => json = json.max(q),
                "text/plain" | "text/*" => text = text.max(q),
                "*/*" => {
                    json = json.max(q * 0.99);
                    text = text.max(q * 0.98);
                }
                _ => {}
            }
        }
        if text > json {
            Format::Text
        } else {
            Format::Json
        }
    }
}

/// Reads the order from the query and the body, field by field. A field given in both
/// must have the same value in both.
fn read_order(
    headers: &HeaderMap,
    query: Result<Query<CheckoutQuery>, QueryRejection>,
    body: &Bytes,
    max_amount: u64,
) -> Result<Order, Problem> {
    let Query(query) = query.map_err(|err| Problem::invalid("query", err.body_text()))?;
    let body = if body.is_empty() {
        None
    } else {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let media = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if media != "application/json" && !media.ends_with("+json") {
            return Err(Problem::invalid(
                "Content-Type",
                format!(
                    "a request body must be application/json, not {:?}; or send the order as query parameters",
                    content_type
                ),
            ));
        }
        let fields: BodyFields = serde_json::from_slice(body).map_err(|err| {
            Problem::invalid("body", format!("the body is not a checkout: {err}"))
        })?;
        Some(fields)
    };
    let (body_order, body_amount, body_currency) = match body {
        Some(b) => {
            let amount = b
                .amount
                .map(|raw| json_decimal(&raw).ok_or(()))
                .transpose()
                .map_err(|_| {
                    Problem::invalid("amount", "amount must be a decimal string or a JSON number")
                })?;
            (b.order_id, amount, b.currency)
        }
        None => (None, None, None),
    };
    let order_id = one_of("orderId", query.order_id, body_order)?.ok_or_else(|| {
        Problem::invalid(
            "orderId",
            "orderId is required, as a query parameter or in the JSON body",
        )
    })?;
    let order_id = OrderId::parse(&order_id)
        .map_err(|err| Problem::invalid("orderId", format!("orderId {err}")))?;
    let currency = match one_of("currency", query.currency, body_currency)? {
        Some(code) => Currency::parse(&code)
            .map_err(|err| Problem::invalid("currency", format!("currency: {err}")))?,
        None => Currency::USD,
    };
    let amount = one_of("amount", query.amount, body_amount)?.ok_or_else(|| {
        Problem::invalid(
            "amount",
            "amount is required, as a query parameter or in the JSON body",
        )
    })?;
    let amount = Money::parse(&amount, currency)
        .and_then(|m| m.at_most(max_amount))
        .map_err(|err| Problem::invalid("amount", format!("amount {err}")))?;
    Ok(Order::new(order_id, amount))
}

fn one_of(
    field: &str,
    query: Option<String>,
    body: Option<String>,
) -> Result<Option<String>, Problem> {
    match (query, body) {
        (Some(q), Some(b)) if q != b => Err(Problem::invalid(
            field,
            format!(
                "{field} is {q:?} in the query but {b:?} in the body; give it once, or the same in both"
            ),
        )),
        (q, b) => Ok(q.or(b)),
    }
}

/// The client's `Idempotency-Key`: a structured-field string (`"…"`, RFC 8941) as the
/// IETF draft has it, or a bare token, which many clients send.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<OperationKey>, Problem> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let invalid = |detail: String| Problem::invalid("Idempotency-Key", detail);
    if values.next().is_some() {
        return Err(invalid(
            "send one Idempotency-Key header, not several".into(),
        ));
    }
    let text = value
        .to_str()
        .map_err(|_| invalid("Idempotency-Key may hold only printable ASCII".into()))?
        .trim();
    let key = match text.strip_prefix('"') {
        Some(rest) => {
            let inner = rest.strip_suffix('"').ok_or_else(|| {
                invalid("Idempotency-Key starts a quoted string but does not end it".into())
            })?;
            let mut key = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        match chars.next() {
                            Some(escaped @ ('"' | '\\')) => key.push(escaped),
                            _ => return Err(invalid(
                                "Idempotency-Key has a bad escape; only \\\" and \\\\ are allowed"
                                    .into(),
                            )),
                        }
                    }
                    '"' => return Err(invalid("Idempotency-Key has an unescaped quote".into())),
                    c => key.push(c),
                }
            }
            key
        }
        None => text.to_owned(),
    };
    OperationKey::from_client(&key)
        .map(Some)
        .map_err(|err| invalid(format!("Idempotency-Key {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_key(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn idempotency_keys_are_sf_strings_or_tokens() {
        let key = |v: &str| idempotency_key(&with_key(v)).map(|k| k.unwrap().to_string());
        assert_eq!(key("\"k-1\"").unwrap(), "k-1");
        assert_eq!(key("\"a \\\"b\\\" \\\\c\"").unwrap(), "a \"b\" \\c");
        assert_eq!(key("k-1").unwrap(), "k-1");
        assert!(key("\"open").is_err());
        assert!(key("\"\"").is_err());
        assert!(key(&"x".repeat(256)).is_err());
        assert!(idempotency_key(&HeaderMap::new()).unwrap().is_none());
    }

    #[test]
    fn accept_picks_text_only_when_preferred() {
        let format = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
            Format::from_accept(&h)
        };
        assert_eq!(format("text/plain"), Format::Text);
        assert_eq!(format("application/json"), Format::Json);
        assert_eq!(format("*/*"), Format::Json);
        assert_eq!(format("text/plain, application/json;q=0.5"), Format::Text);
        assert_eq!(format("application/json, text/plain;q=0.9"), Format::Json);
        assert_eq!(format("text/html"), Format::Json);
        assert_eq!(Format::from_accept(&HeaderMap::new()), Format::Json);
    }
}
