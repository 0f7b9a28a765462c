//! Errors as `application/problem+json` (RFC 9457), with a stable `code`. The body is one
//! typed struct: what the OpenAPI document shows is what the serializer writes.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

use super::answer::HttpAnswer;
use crate::assistant::{ChargeReport, ChargeStatus};
use crate::caller::AuthRefusal;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// The stable error codes of the HTTP contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    InvalidRequest,
    ContentTooLarge,
    Unauthorized,
    PaymentDeclined,
    PaymentRequiresAction,
    AmountConflict,
    InFlight,
    KeyReuse,
    ModelError,
    ModelDidNotCharge,
    ProviderError,
    Unavailable,
    Overloaded,
    RateLimited,
    DeadlineExceeded,
    JournalMismatch,
    NotFound,
    MethodNotAllowed,
    /// The API key lacks the scope the operation needs.
    Forbidden,
    /// The caller's budget for the day would be passed.
    BudgetExceeded,
    /// A person denied the checkout's approval.
    ApprovalDenied,
    /// The approval was decided the other way already.
    ApprovalDecided,
    /// The approval expired undecided.
    ApprovalExpired,
    /// A refund of an order that has no receipt.
    NotCharged,
    /// A refund that would pass what the order was charged.
    RefundExceedsCharge,
    /// The model ended without refunding.
    ModelDidNotRefund,
    /// The payment provider refused the refund.
    RefundRefused,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidRequest => "invalid_request",
            Code::ContentTooLarge => "content_too_large",
            Code::Unauthorized => "unauthorized",
            Code::PaymentDeclined => "payment_declined",
            Code::PaymentRequiresAction => "payment_requires_action",
            Code::AmountConflict => "amount_conflict",
            Code::InFlight => "in_flight",
            Code::KeyReuse => "key_reuse",
            Code::ModelError => "model_error",
            Code::ModelDidNotCharge => "model_did_not_charge",
            Code::ProviderError => "provider_error",
            Code::Unavailable => "unavailable",
            Code::Overloaded => "overloaded",
            Code::RateLimited => "rate_limited",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::JournalMismatch => "journal_mismatch",
            Code::NotFound => "not_found",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::Forbidden => "forbidden",
            Code::BudgetExceeded => "budget_exceeded",
            Code::ApprovalDenied => "approval_denied",
            Code::ApprovalDecided => "approval_decided",
            Code::ApprovalExpired => "approval_expired",
            Code::NotCharged => "not_charged",
            Code::RefundExceedsCharge => "refund_exceeds_charge",
            Code::ModelDidNotRefund => "model_did_not_refund",
            Code::RefundRefused => "refund_refused",
        }
    }

    /// Outcomes that a repeat of the same request would meet again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Code::InvalidRequest
                | Code::ContentTooLarge
                | Code::AmountConflict
                | Code::ModelDidNotCharge
                | Code::PaymentDeclined
                | Code::PaymentRequiresAction
                | Code::BudgetExceeded
                | Code::ApprovalDenied
                | Code::ApprovalExpired
                | Code::NotCharged
                | Code::RefundExceedsCharge
                | Code::ModelDidNotRefund
                | Code::RefundRefused
        )
    }

    pub fn status(self) -> StatusCode {
        match self {
            Code::InvalidRequest => StatusCode::BAD_REQUEST,
            // RFC 9110 §15.5.14 names it Content Too Large (the http crate keeps the
            // older name).
            Code::ContentTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::Unauthorized => StatusCode::UNAUTHORIZED,
            Code::PaymentDeclined | Code::PaymentRequiresAction => StatusCode::PAYMENT_REQUIRED,
            Code::AmountConflict | Code::InFlight => StatusCode::CONFLICT,
            Code::KeyReuse => StatusCode::UNPROCESSABLE_ENTITY,
            Code::ModelError | Code::ModelDidNotCharge | Code::ProviderError => {
                StatusCode::BAD_GATEWAY
            }
            Code::Unavailable | Code::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Code::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::JournalMismatch => StatusCode::INTERNAL_SERVER_ERROR,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Code::Forbidden | Code::BudgetExceeded | Code::ApprovalDenied => StatusCode::FORBIDDEN,
            Code::ApprovalDecided => StatusCode::CONFLICT,
            Code::ApprovalExpired => StatusCode::GONE,
            Code::NotCharged => StatusCode::NOT_FOUND,
            Code::RefundExceedsCharge => StatusCode::CONFLICT,
            Code::ModelDidNotRefund => StatusCode::BAD_GATEWAY,
            Code::RefundRefused => StatusCode::PAYMENT_REQUIRED,
        }
    }

    fn title(self) -> &'static str {
        match self {
            Code::InvalidRequest => "The request is invalid",
            Code::ContentTooLarge => "The request body is too large",
            Code::Unauthorized => "A valid API key is required",
            Code::PaymentDeclined => "The payment was declined",
            Code::PaymentRequiresAction => "The payment needs the customer's action",
            Code::AmountConflict => "The order was already charged another amount",
            Code::InFlight => "A request with this Idempotency-Key is still being processed",
            Code::KeyReuse => "The Idempotency-Key was used for another request",
            Code::ModelError => "The model provider failed",
            Code::ModelDidNotCharge => "The model finished without charging",
            Code::ProviderError => "The payment provider failed",
            Code::Unavailable => "The service cannot reach its database",
            Code::Overloaded => "The service is running as many checkouts as it takes at once",
            Code::RateLimited => "Too many checkouts from this caller",
            Code::DeadlineExceeded => "The checkout did not finish in time",
            Code::JournalMismatch => "The operation's journal does not match its replay",
            Code::NotFound => "Not found",
            Code::MethodNotAllowed => "Method not allowed",
            Code::Forbidden => "The API key does not carry the scope this operation needs",
            Code::BudgetExceeded => "The caller's spending budget for the day would be passed",
            Code::ApprovalDenied => "A person denied the approval",
            Code::ApprovalDecided => "The approval was already decided the other way",
            Code::ApprovalExpired => "The approval expired before anyone decided it",
            Code::NotCharged => "The order has not been charged",
            Code::RefundExceedsCharge => "The refund would pass what the order was charged",
            Code::ModelDidNotRefund => "The model finished without refunding",
            Code::RefundRefused => "The payment provider refused the refund",
        }
    }
}

/// The body of every error answer.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProblemBody {
    /// `urn:checkout:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    /// What went wrong, for a person.
    pub detail: String,
    pub code: Code,
    /// For `invalid_request`: the field, parameter or header at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For checkout failures: loop attempts made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// For model failures: requests sent for the round that failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_attempts: Option<u32>,
    /// For checkout failures: the layer that gave up (`request retry`, `loop retry`,
    /// `loop timeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
    /// For model failures: the provider's HTTP status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    /// For checkout failures and `amount_conflict`: whether the order is charged, by any
    /// operation (`null`: unknown, the database could not be asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<bool>)]
    pub order_charged: Option<Option<bool>>,
    /// For checkout failures: whether this operation made the charge (`null`: unknown, a
    /// charge statement may have reached the database unseen).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<bool>)]
    pub charged: Option<Option<bool>>,
    /// For checkout failures and `amount_conflict`: the order's receipt, when charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt_id: Option<String>,
    /// For checkout failures and `amount_conflict`: the amount the order was charged,
    /// when charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charged_amount: Option<String>,
    /// For checkout failures and `amount_conflict`: the currency the order was charged
    /// in, when charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charged_currency: Option<String>,
    /// For `payment_declined`: the payment provider's decline code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// For `payment_declined` and `payment_requires_action`: the payment provider's id of
    /// the payment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_id: Option<String>,
    /// For `budget_exceeded`: what is left of the caller's budget for the UTC day, in the
    /// order's currency.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "20.00")]
    pub budget_left: Option<String>,
    /// For `refund_exceeds_charge`: what is left to refund of the order's charge.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "10.00")]
    pub refund_left: Option<String>,
}

impl ProblemBody {
    /// What a failed checkout leaves of the order's charge: whether the order is charged
    /// (by any operation), whether this operation charged it, and the order's receipt,
    /// amount and currency when it is charged.
    pub fn charge(&mut self, report: &ChargeReport) {
        self.order_charged = Some(report.order.known());
        self.charged = Some(report.this_checkout.known());
        if let ChargeStatus::Charged(receipt) = &report.order {
            self.receipt_id = Some(receipt.id.to_string());
            self.charged_amount = Some(receipt.amount.decimal());
            self.charged_currency = Some(receipt.amount.currency().code().to_owned());
        }
    }
}

/// An error answer. Build with [`Problem::new`], fill in `body`, return it.
#[derive(Debug, Clone)]
pub struct Problem {
    pub body: Box<ProblemBody>,
    retry_after: Option<u64>,
}

impl Problem {
    pub fn new(code: Code, detail: impl Into<String>) -> Self {
        Problem {
            body: Box::new(ProblemBody {
                kind: format!("urn:checkout:problem:{}", code.as_str()),
                title: code.title().to_owned(),
                status: code.status().as_u16(),
                detail: detail.into(),
                code,
                field: None,
                attempts: None,
                request_attempts: None,
                layer: None,
                upstream_status: None,
                order_charged: None,
                charged: None,
                receipt_id: None,
                charged_amount: None,
                charged_currency: None,
                decline_code: None,
                payment_id: None,
                budget_left: None,
                refund_left: None,
            }),
            retry_after: None,
        }
    }

    /// A 400 naming the field, parameter or header at fault.
    /// A 503 `unavailable` (the database, or another store, could not be reached): worth
    /// a retry in a second.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Problem::new(Code::Unavailable, detail).retry_after(1)
    }

    pub fn invalid(field: &str, detail: impl Into<String>) -> Self {
        let mut problem = Problem::new(Code::InvalidRequest, detail);
        problem.body.field = Some(field.to_owned());
        problem
    }

    /// A 401 for a request without a valid API key, saying which way it fell short.
    pub fn unauthorized(why: AuthRefusal) -> Self {
        Problem::new(
            Code::Unauthorized,
            match why {
                AuthRefusal::Missing => {
                    "this endpoint needs an API key: send Authorization: Bearer <key> (an operator makes one with `checkout api-keys create NAME`)"
                }
                AuthRefusal::NotBearer => "the Authorization header must be Bearer <key>",
                AuthRefusal::Invalid => "the API key is not valid: no such key, or it was revoked",
            },
        )
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub fn code(&self) -> Code {
        self.body.code
    }

    /// The answer to send (and, for final outcomes, to save for replay).
    pub fn answer(self) -> HttpAnswer {
        let code = self.code();
        // A refusal under load is not a failure to log one by one: /metrics counts them.
        if code.status().is_server_error() && code != Code::Overloaded {
            tracing::error!(code = code.as_str(), detail = %self.body.detail, "request failed");
        }
        let body = serde_json::to_vec(&self.body).expect("a problem always serializes");
        let mut answer = HttpAnswer::new(code.status(), PROBLEM_JSON, body);
        answer.retry_after = self.retry_after;
        answer.final_outcome = code.is_final();
        answer
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.answer().into_response()
    }
}

/// The error answers of one endpoint, for its OpenAPI document: per status a description
/// and one example per code, each example a [`Problem`] serialized as it is sent.
pub fn documented(
    statuses: impl IntoIterator<Item = (&'static str, Vec<Problem>)>,
) -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
    statuses
        .into_iter()
        .map(|(description, examples)| {
            let status = examples[0].code().status().as_u16().to_string();
            let content = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ProblemBody")))
                .examples_from_iter(examples.into_iter().map(|problem| {
                    let example = ExampleBuilder::new()
                        .summary(problem.code().as_str())
                        .value(Some(
                            serde_json::to_value(&problem.body).expect("a problem serializes"),
                        ))
                        .build();
                    (problem.code().as_str(), example)
                }))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content(PROBLEM_JSON, content)
                .build();
            (status, RefOr::T(response))
        })
        .collect()
}
