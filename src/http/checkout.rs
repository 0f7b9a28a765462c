//! `POST /checkout`: validate, make the keys, run the assistant, answer.

use std::collections::BTreeMap;

use axum::extract::{Extension, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type};
use utoipa::openapi::{RefOr, Response as DocResponse};
use utoipa::{IntoParams, IntoResponses, PartialSchema, ToSchema};

use super::answer::Answer;
use super::error::{Code, Problem, documented};
use super::extract::{JsonBody, Params};
use super::idempotent::{self, IdempotencyKey};
use super::receipts::ReceiptView;
use super::state::AppState;
use crate::assistant::{
    ChargeStatus, CheckoutContext, CheckoutError, CheckoutOutcome, FailureKind, JournalFailure,
    Usage,
};
use crate::caller::{Caller, Refusal};
use crate::idempotency::{Fingerprint, Lease};
use crate::outbox::{Confirmation, Recipient};
use crate::payments::money::json_decimal;
use crate::payments::{ChargeError, Currency, Money, OperationKey, Order, OrderId, PaymentMethod};

/// A plain decimal above zero with at most 3 minor digits: no sign, no exponent, no
/// separators. How many minor digits, and how large, depend on the currency and the
/// settings, which a pattern cannot say. (The derive macros take only string literals, so
/// the query parameter repeats it.)
const AMOUNT_PATTERN: &str =
    "^(0*[1-9][0-9]*(\\.[0-9]{1,3})?|0+\\.([1-9][0-9]{0,2}|0[1-9][0-9]?|00[1-9]))$";

/// The order to charge, as query parameters (as in the article:
/// `POST /checkout?orderId=A-100&amount=42.50`).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CheckoutQuery {
    /// The order id: 1–64 of `A-Z a-z 0-9 . _ : -`, starting with a letter or digit.
    /// Required here or in the JSON body.
    #[param(
        example = "A-100",
        min_length = 1,
        max_length = 64,
        pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
    )]
    #[serde(rename = "orderId")]
    order_id: Option<String>,
    /// The amount, a decimal > 0 with at most the currency's minor digits (0 for JPY and
    /// KRW, 3 for BHD and KWD, 2 for the others), at most the configured maximum.
    /// Required here or in the JSON body.
    #[param(
        example = "42.50",
        pattern = "^(0*[1-9][0-9]*(\\.[0-9]{1,3})?|0+\\.([1-9][0-9]{0,2}|0[1-9][0-9]?|00[1-9]))$"
    )]
    amount: Option<String>,
    #[param(schema_with = currency_schema)]
    currency: Option<String>,
    /// The customer's address (one, at most 254 characters, at most 64 before the `@`):
    /// with it, the assistant also sends the confirmation email, once per operation.
    // The pattern is `outbox::EMAIL_PATTERN`, repeated: the derive macros take literals.
    #[param(
        example = "ann@example.com",
        max_length = 254,
        pattern = "^[A-Za-z0-9_%+-]+(\\.[A-Za-z0-9_%+-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
    )]
    email: Option<String>,
    /// The payment provider's payment method (`pm_…`, e.g. `pm_card_visa`): required
    /// with a payment provider (`CHECKOUT_PAYMENT_PROVIDER=stripe`), optional with the ledger.
    #[param(
        example = "pm_card_visa",
        max_length = 255,
        pattern = "^pm_[A-Za-z0-9_]+$"
    )]
    #[serde(rename = "paymentMethod")]
    payment_method: Option<String>,
}

/// The order to charge, as a JSON body (instead of, or agreeing with, the query). An
/// empty object, or no body, leaves the query parameters to say it.
#[derive(Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schema(example = json!({"orderId": "A-100", "amount": "42.50", "currency": "USD"}))]
pub struct CheckoutBody {
    /// The order id: 1–64 of `A-Z a-z 0-9 . _ : -`, starting with a letter or digit.
    #[schema(
        example = "A-100",
        min_length = 1,
        max_length = 64,
        pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
    )]
    order_id: Option<String>,
    amount: Option<JsonAmount>,
    #[schema(schema_with = nullable_currency_schema)]
    currency: Option<String>,
    /// The customer's address (one, at most 254 characters, at most 64 before the `@`):
    /// with it, the confirmation email is sent once per operation.
    #[schema(
        example = "ann@example.com",
        max_length = 254,
        pattern = "^[A-Za-z0-9_%+-]+(\\.[A-Za-z0-9_%+-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
    )]
    email: Option<String>,
    /// The payment provider's payment method (`pm_…`): required with a payment provider,
    /// optional with the ledger.
    #[schema(
        example = "pm_card_visa",
        max_length = 255,
        pattern = "^pm_[A-Za-z0-9_]+$"
    )]
    payment_method: Option<String>,
}

/// The amount as a decimal string (`"42.50"`) or a JSON number (`42.50`), kept as written:
/// a number is read from its digits, never through a float.
#[derive(Deserialize)]
#[serde(transparent)]
pub struct JsonAmount(Box<RawValue>);

impl PartialSchema for JsonAmount {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(AMOUNT_PATTERN)),
            )
            .item(
                // Read from its digits: a number written with an exponent (`1e3`) is
                // refused, so the largest a client prints without one is the bound.
                ObjectBuilder::new()
                    .schema_type(Type::Number)
                    .exclusive_minimum(Some(0.0))
                    .maximum(Some(1e12))
                    .multiple_of(Some(0.001)),
            )
            .description(Some(
                "A decimal > 0 with at most the currency's minor digits, as a string or a JSON number, read exactly",
            ))
            .examples([serde_json::json!("42.50")])
            .into()
    }
}

impl ToSchema for JsonAmount {}

/// The currencies taken, from the list the handler checks against.
fn currency_schema() -> Schema {
    currency_schema_of(false)
}

/// In the body, `null` is as good as leaving the currency out.
fn nullable_currency_schema() -> Schema {
    currency_schema_of(true)
}

fn currency_schema_of(nullable: bool) -> Schema {
    let schema_type = if nullable {
        SchemaType::from_iter([Type::String, Type::Null])
    } else {
        Type::String.into()
    };
    let codes = Currency::codes().map(serde_json::Value::from);
    ObjectBuilder::new()
        .schema_type(schema_type)
        .enum_values(Some(
            codes.chain(nullable.then_some(serde_json::Value::Null)),
        ))
        .description(Some("ISO 4217 code; `USD` when not given"))
        .examples([serde_json::json!("USD")])
        .into()
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
    pub usage: UsageView,
    /// The confirmation email, when the request named an `email` and the assistant sent
    /// it: queued or sent, and its Message-ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
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
}

impl From<Usage> for UsageView {
    fn from(usage: Usage) -> Self {
        UsageView {
            model_requests: usage.model_requests,
            replayed_steps: usage.replayed_steps,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
        }
    }
}

/// The error answers of `POST /checkout`, each status with an example of each code.
pub struct CheckoutErrors;

impl IntoResponses for CheckoutErrors {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        let receipt = "0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f";
        let failed = |code, detail: &str, charged: bool| {
            let mut problem = Problem::new(code, detail);
            problem.body.attempts = Some(1);
            problem.body.order_charged = Some(Some(charged));
            problem.body.charged = Some(Some(charged));
            if charged {
                problem.body.receipt_id = Some(receipt.to_owned());
            }
            problem
        };
        let mut conflict = Problem::new(
            Code::AmountConflict,
            "order A-100 was already charged 42.50 USD, not 43.00 USD; nothing was charged",
        );
        conflict.body.order_charged = Some(Some(true));
        conflict.body.receipt_id = Some(receipt.to_owned());
        conflict.body.charged_amount = Some("42.50".to_owned());
        conflict.body.charged_currency = Some("USD".to_owned());
        let mut model_error = failed(
            Code::ModelError,
            "the model provider answered 503 server_error: overloaded; the request retry gave up after 3 requests; the loop retry gave up after 3 loop attempts; the order was not charged",
            false,
        );
        model_error.body.attempts = Some(3);
        model_error.body.request_attempts = Some(3);
        model_error.body.upstream_status = Some(503);
        model_error.body.layer = Some("loop retry".to_owned());
        let mut unavailable = failed(
            Code::Unavailable,
            "the database did not answer: pool timed out while waiting for an open connection; the loop retry gave up after 3 loop attempts; whether order A-100 was charged is unknown until the database answers (GET /receipts/A-100)",
            false,
        );
        unavailable.body.attempts = Some(3);
        unavailable.body.layer = Some("loop retry".to_owned());
        unavailable.body.order_charged = Some(None);
        unavailable.body.charged = Some(None);
        let mut deadline = failed(
            Code::DeadlineExceeded,
            "the model provider did not answer within 10000 ms; the request retry gave up after 3 requests; the loop retry is off; order A-100 is charged (receipt 0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f)",
            true,
        );
        deadline.body.request_attempts = Some(3);
        deadline.body.layer = Some("request retry".to_owned());
        let mut declined = Problem::new(
            Code::PaymentDeclined,
            "the payment provider declined the payment (generic_decline): Your card was declined.; the loop retry does not repeat this failure (1 loop attempt); the order was not charged; a new checkout of it makes a new attempt",
        );
        declined.body.decline_code = Some("generic_decline".to_owned());
        declined.body.payment_id = Some("pi_3MtwBwLkdIwHu7ix28a3tqPa".to_owned());
        declined.body.attempts = Some(1);
        declined.body.order_charged = Some(Some(false));
        declined.body.charged = Some(Some(false));
        let mut requires_action = Problem::new(
            Code::PaymentRequiresAction,
            "the payment needs the customer's action at the payment provider (3-D Secure), payment pi_3MtwBwLkdIwHu7ix28a3tqPa; completing it is out of scope; the loop retry does not repeat this failure (1 loop attempt); the order was not charged",
        );
        requires_action.body.payment_id = Some("pi_3MtwBwLkdIwHu7ix28a3tqPa".to_owned());
        requires_action.body.attempts = Some(1);
        requires_action.body.order_charged = Some(Some(false));
        requires_action.body.charged = Some(Some(false));
        let mut provider_error = failed(
            Code::ProviderError,
            "the payment provider gave no outcome: the payment provider answered 503 : overloaded; no payment of attempt 1 is found by its metadata yet; the loop retry gave up after 3 loop attempts; whether the payment provider charged order A-100 is unknown: its payment intent stays open, and the next run of this checkout (a retry with the same Idempotency-Key, another checkout of the order, the recovery sweep) settles it under the same key, never charging it twice",
            false,
        );
        provider_error.body.attempts = Some(3);
        provider_error.body.layer = Some("loop retry".to_owned());
        provider_error.body.order_charged = Some(None);
        provider_error.body.charged = Some(None);
        documented([
            (
                "Invalid input (`invalid_request`, with `field`); nothing was charged",
                vec![Problem::invalid(
                    "amount",
                    "amount 1.234 has more than 2 digit(s) after the decimal point, the most USD allows",
                )],
            ),
            (
                "`unauthorized`: no valid API key (see WWW-Authenticate); nothing was charged",
                vec![Problem::unauthorized(Refusal::Missing)],
            ),
            (
                "`payment_declined`: the payment provider declined the payment (with its `declineCode`); `payment_requires_action`: the provider waits for the customer (3-D Secure, not completed by this service). Nothing was charged",
                vec![declined, requires_action],
            ),
            (
                "`amount_conflict`: the order was charged another amount; or `in_flight`: the same Idempotency-Key is still running (see Retry-After)",
                vec![
                    conflict,
                    Problem::new(
                        Code::InFlight,
                        "a request with Idempotency-Key \"order-A-100\" is still being processed; retry after it finishes",
                    ),
                ],
            ),
            (
                "`key_reuse`: the Idempotency-Key was used with another order or amount",
                vec![Problem::new(
                    Code::KeyReuse,
                    "Idempotency-Key \"order-A-100\" was first used for another request (another order, amount or currency); a new request needs a new key",
                )],
            ),
            (
                "`model_error`: the model provider failed after retries; `model_did_not_charge`: the model finished without charging; `provider_error`: the payment provider gave no outcome or refused the request",
                vec![
                    provider_error,
                    model_error,
                    failed(
                        Code::ModelDidNotCharge,
                        "the model finished without charging the order; the loop retry does not repeat this failure (1 loop attempt); the order was not charged",
                        false,
                    ),
                ],
            ),
            (
                "`unavailable`: the database could not be reached (see Retry-After)",
                vec![unavailable],
            ),
            (
                "`deadline_exceeded`: the checkout timed out after retries",
                vec![deadline],
            ),
            (
                "`journal_mismatch`: the operation's journal does not match its replay (never replayed silently); nothing further was run",
                vec![Problem::new(
                    Code::JournalMismatch,
                    "the operation's journal does not match its replay at step 2: the journal has the result of tool \"refund\" (call call_1_1), the replayed answer calls \"charge\" (call call_1_1)",
                )],
            ),
        ])
    }
}

#[utoipa::path(
    post,
    path = "/checkout",
    tag = "checkout",
    summary = "Charge an order through the checkout assistant",
    description = "Runs the assistant loop: the model calls the `charge` tool, the gateway charges the order once (keyed by the order id), the model confirms. Give the order as query parameters or as a JSON body; a field given in both must agree. Send `Accept: text/plain` for the confirmation sentence alone.",
    params(CheckoutQuery, IdempotencyKey),
    security(("api_key" = [])),
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
        CheckoutErrors,
    )
)]
pub async fn checkout(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    format: Format,
    IdempotencyKey(client_key): IdempotencyKey,
    Params(mut query): Params<CheckoutQuery>,
    JsonBody(mut body): JsonBody<CheckoutBody>,
) -> Response {
    let needs_method = app.gateway().needs_payment_method();
    let email = recipient(query.email.take(), body.email.take());
    let checked = order(
        query,
        body,
        app.settings().payments.max_amount,
        needs_method,
    )
    .and_then(|order| Ok((order, email?)));
    let (order, email) = match checked {
        Ok(checked) => checked,
        Err(problem) => {
            app.metrics().checkout(Code::InvalidRequest.as_str());
            return problem.into_response();
        }
    };
    match client_key {
        Some(key) => {
            let scope = caller.map(|Extension(c)| c.0).unwrap_or_default();
            let mut fingerprint = Fingerprint::of_checkout(&order).with_email(email.as_ref());
            if format == Format::Text {
                // Kept with the request for the recovery sweep; not part of its identity.
                fingerprint = fingerprint.noting("accept", "text/plain");
            }
            let work = {
                let (app, key, scope) = (app.clone(), key.clone(), scope.clone());
                move |lease: &Lease| {
                    let fence = Some(lease.fence);
                    async move { run(&app, order, email, key, &scope, fence, format).await }
                }
            };
            // Boxed, like the failure path: a handler future is as large as its largest
            // branch, and thousands of checkouts wait at once.
            Box::pin(idempotent::once(&app, &scope, &key, &fingerprint, work)).await
        }
        None => {
            let operation_key = OperationKey::mint();
            idempotent::detached(async move {
                run(&app, order, email, operation_key, "", None, format).await
            })
            .await
            .into_response()
        }
    }
}

/// The order from the query and the body, field by field. A field given in both must
/// have the same value in both. `needs_method`: a payment provider takes the payment.
fn order(
    query: CheckoutQuery,
    body: CheckoutBody,
    max_amount: u64,
    needs_method: bool,
) -> Result<Order, Problem> {
    let body_amount = body
        .amount
        .map(|JsonAmount(raw)| json_decimal(&raw).ok_or(()))
        .transpose()
        .map_err(|()| {
            Problem::invalid("amount", "amount must be a decimal string or a JSON number")
        })?;
    let order_id = one_of("orderId", query.order_id, body.order_id)?.ok_or_else(|| {
        Problem::invalid(
            "orderId",
            "orderId is required, as a query parameter or in the JSON body",
        )
    })?;
    let order_id = OrderId::parse(&order_id)
        .map_err(|err| Problem::invalid("orderId", format!("orderId {err}")))?;
    let currency = match one_of("currency", query.currency, body.currency)? {
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
    let method = one_of("paymentMethod", query.payment_method, body.payment_method)?
        .map(|m| PaymentMethod::parse(&m))
        .transpose()
        .map_err(|err| Problem::invalid("paymentMethod", format!("paymentMethod {err}")))?;
    if needs_method && method.is_none() {
        return Err(Problem::invalid(
            "paymentMethod",
            "paymentMethod is required with the payment provider, as a query parameter or in the JSON body (a pm_… id, e.g. pm_card_visa)",
        ));
    }
    Ok(Order::new(order_id, amount).with_payment_method(method))
}

/// A request as its Idempotency-Key record keeps it ([`Fingerprint::request`]), checked
/// again as the handler checks it: what the recovery sweep resumes.
pub(crate) fn rebuild(
    request: &str,
    max_amount: u64,
) -> Result<(Order, Option<Recipient>, Format), String> {
    let mut fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(request).map_err(|err| err.to_string())?;
    let format = match fields.remove("accept") {
        Some(accept) if accept == "text/plain" => Format::Text,
        _ => Format::Json,
    };
    let mut query: CheckoutQuery =
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(|err| err.to_string())?;
    let email = recipient(query.email.take(), None).map_err(|p| p.body.detail.clone())?;
    // The method was required, or not, when the request was first taken.
    let order =
        order(query, CheckoutBody::default(), max_amount, false).map_err(|p| p.body.detail)?;
    Ok((order, email, format))
}

/// The customer's address, if the query or the body names one.
fn recipient(query: Option<String>, body: Option<String>) -> Result<Option<Recipient>, Problem> {
    one_of("email", query, body)?
        .map(|text| {
            Recipient::parse(&text).map_err(|err| Problem::invalid("email", format!("email {err}")))
        })
        .transpose()
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

/// Runs one checkout to its answer. Everything retried happens inside `assistant`. The
/// operation is the caller's (`scope`), under its Idempotency-Key lease's `fence` if any.
pub(crate) async fn run(
    app: &AppState,
    order: Order,
    email: Option<Recipient>,
    operation_key: OperationKey,
    scope: &str,
    fence: Option<i64>,
    format: Format,
) -> Answer {
    let ctx = CheckoutContext::new(order, email, operation_key, scope, fence);
    match app.assistant().checkout(ctx.clone()).await {
        Ok(outcome) => {
            app.metrics().checkout("ok");
            let confirmation = Box::pin(confirmation(app, &ctx)).await;
            success(&ctx, outcome, confirmation, format)
        }
        Err(err) => {
            let problem = Box::pin(failure(app, &ctx, err)).await;
            app.metrics().checkout(problem.body.code.as_str());
            problem.answer()
        }
    }
}

/// The operation's confirmation email as it stands, when the request named an address.
async fn confirmation(app: &AppState, ctx: &CheckoutContext) -> Option<Confirmation> {
    ctx.email()?;
    let key = ctx.journal_key();
    match app
        .outbox()
        .confirmation(&key.scope, &key.operation_key)
        .await
    {
        Ok(confirmation) => confirmation,
        Err(err) => {
            tracing::warn!(error = %err, "cannot read the confirmation's outbox row; the answer leaves it out");
            None
        }
    }
}

fn success(
    ctx: &CheckoutContext,
    outcome: CheckoutOutcome,
    confirmation: Option<Confirmation>,
    format: Format,
) -> Answer {
    let usage = outcome.usage;
    tracing::info!(
        order = %ctx.order().id(),
        receipt = %outcome.receipt.id,
        charged = outcome.charged,
        attempts = outcome.attempts,
        model_requests = usage.model_requests,
        replayed_steps = usage.replayed_steps,
        input_tokens = usage.input_tokens,
        output_tokens = usage.output_tokens,
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
                usage: UsageView::from(usage),
                confirmation,
            };
            Answer::json(StatusCode::OK, &body)
        }
    }
}

/// The error answer, saying which layer gave up and whether the order is charged.
async fn failure(app: &AppState, ctx: &CheckoutContext, err: CheckoutError) -> Problem {
    let usage = ctx.usage();
    tracing::warn!(
        order = %ctx.order().id(),
        error = %err,
        cause = ?std::error::Error::source(&err),
        model_requests = usage.model_requests,
        replayed_steps = usage.replayed_steps,
        input_tokens = usage.input_tokens,
        output_tokens = usage.output_tokens,
        "checkout failed"
    );
    if let Some(existing) = err.kind.amount_conflict() {
        let mut problem = Problem::new(
            Code::AmountConflict,
            format!("{}; nothing was charged", err.kind),
        );
        let body = &mut problem.body;
        body.order_charged = Some(Some(true));
        body.receipt_id = Some(existing.id.to_string());
        body.charged_amount = Some(existing.amount.decimal());
        body.charged_currency = Some(existing.amount.currency().code().to_owned());
        return problem;
    }
    match err.kind.charge_error() {
        Some(ChargeError::Declined {
            decline_code,
            payment_id,
            ..
        }) => {
            let mut problem = Problem::new(
                Code::PaymentDeclined,
                format!(
                    "{}; the order was not charged; a new checkout of it makes a new attempt",
                    err.kind
                ),
            );
            problem.body.decline_code = Some(decline_code.clone());
            problem.body.payment_id = payment_id.clone();
            problem.body.attempts = Some(err.attempts);
            problem.body.order_charged = Some(Some(false));
            problem.body.charged = Some(Some(false));
            return problem;
        }
        Some(ChargeError::RequiresAction { payment_id }) => {
            let mut problem = Problem::new(
                Code::PaymentRequiresAction,
                format!("{}; the order was not charged", err.kind),
            );
            problem.body.payment_id = Some(payment_id.clone());
            problem.body.attempts = Some(err.attempts);
            problem.body.order_charged = Some(Some(false));
            problem.body.charged = Some(Some(false));
            return problem;
        }
        _ => {}
    }
    let code = match &err.kind {
        FailureKind::Timeout(_) => Code::DeadlineExceeded,
        FailureKind::Model(_) if err.kind.is_deadline() => Code::DeadlineExceeded,
        FailureKind::Model(_) | FailureKind::TooManyRounds(_) => Code::ModelError,
        FailureKind::ModelDidNotCharge => Code::ModelDidNotCharge,
        FailureKind::Tool(_)
            if matches!(
                err.kind.charge_error(),
                Some(ChargeError::Provider(_) | ChargeError::NoPaymentMethod)
            ) =>
        {
            Code::ProviderError
        }
        // An amount conflict was answered above: what is left is the database.
        FailureKind::Tool(_) | FailureKind::Journal(JournalFailure::Store(_)) => Code::Unavailable,
        FailureKind::Journal(JournalFailure::LeaseLost) => Code::InFlight,
        FailureKind::Journal(JournalFailure::Mismatch { .. }) => Code::JournalMismatch,
    };
    let report = ctx.charge_report(app.gateway()).await;
    // No receipt, but the provider may have charged under the intent it was sent: unknown
    // until a run settles the intent with its key.
    let intent_open = matches!(
        err.kind.charge_error(),
        Some(ChargeError::Provider(provider)) if !provider.charged_nothing()
    ) && report.order == ChargeStatus::NotCharged;
    let mut problem = if intent_open {
        Problem::new(
            code,
            format!(
                "{err}; whether the payment provider charged order {} is unknown: its payment intent stays open, and the next run of this checkout (a retry with the same Idempotency-Key, another checkout of the order, the recovery sweep) settles it under the same key, never charging it twice",
                ctx.order().id()
            ),
        )
    } else {
        Problem::new(code, format!("{err}; {report}"))
    };
    if code == Code::Unavailable {
        problem = problem.retry_after(1);
    }
    if let Some(wait) = err.kind.model_error().and_then(|m| m.kind.retry_after()) {
        // The provider said when it will take requests again; so do we.
        problem = problem.retry_after(wait.as_secs().max(1));
    }
    let body = &mut problem.body;
    body.attempts = Some(err.attempts);
    if let Some(model) = err.kind.model_error() {
        body.request_attempts = Some(model.attempts);
        body.upstream_status = model.kind.upstream_status();
    }
    body.layer = err.layer().map(str::to_owned);
    if let ChargeStatus::Charged(receipt) = &report.order {
        body.receipt_id = Some(receipt.id.to_string());
    }
    if intent_open {
        body.order_charged = Some(None);
        body.charged = Some(None);
    } else {
        body.order_charged = Some(report.order.known());
        body.charged = Some(report.this_checkout.known());
    }
    problem
}

/// JSON unless the client prefers `text/plain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Text,
}

impl<S: Send + Sync> FromRequestParts<S> for Format {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Format::from_accept(&parts.headers))
    }
}

impl Format {
    pub fn from_accept(headers: &axum::http::HeaderMap) -> Format {
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

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
