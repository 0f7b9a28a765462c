//! Errors as `application/problem+json` (RFC 9457), with a stable `code`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::Answer;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// The stable error codes of the HTTP contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    InvalidRequest,
    AmountConflict,
    InFlight,
    KeyReuse,
    ModelError,
    ModelDidNotCharge,
    Unavailable,
    DeadlineExceeded,
    NotFound,
    MethodNotAllowed,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidRequest => "invalid_request",
            Code::AmountConflict => "amount_conflict",
            Code::InFlight => "in_flight",
            Code::KeyReuse => "key_reuse",
            Code::ModelError => "model_error",
            Code::ModelDidNotCharge => "model_did_not_charge",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::MethodNotAllowed => "method_not_allowed",
        }
    }

    /// Outcomes that a repeat of the same request would meet again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Code::InvalidRequest | Code::AmountConflict | Code::ModelDidNotCharge
        )
    }

    fn status(self) -> StatusCode {
        match self {
            Code::InvalidRequest => StatusCode::BAD_REQUEST,
            Code::AmountConflict | Code::InFlight => StatusCode::CONFLICT,
            Code::KeyReuse => StatusCode::UNPROCESSABLE_ENTITY,
            Code::ModelError | Code::ModelDidNotCharge => StatusCode::BAD_GATEWAY,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    fn title(self) -> &'static str {
        match self {
            Code::InvalidRequest => "The request is invalid",
            Code::AmountConflict => "The order was already charged another amount",
            Code::InFlight => "A request with this Idempotency-Key is still being processed",
            Code::KeyReuse => "The Idempotency-Key was used for another request",
            Code::ModelError => "The model provider failed",
            Code::ModelDidNotCharge => "The model finished without charging",
            Code::Unavailable => "The service cannot reach its database",
            Code::DeadlineExceeded => "The checkout did not finish in time",
            Code::NotFound => "Not found",
            Code::MethodNotAllowed => "Method not allowed",
        }
    }
}

/// An error answer. Build with [`Problem::new`], add members, return it.
#[derive(Debug, Clone)]
pub struct Problem {
    pub code: Code,
    pub detail: String,
    members: Map<String, Value>,
    retry_after: Option<u64>,
}

/// The body of every error answer (documented in the OpenAPI document).
#[derive(Serialize, ToSchema)]
#[schema(example = json!({
    "type": "urn:checkout:problem:invalid_request",
    "title": "The request is invalid",
    "status": 400,
    "detail": "amount 1.234 has more than 2 digit(s) after the decimal point, the most USD allows",
    "code": "invalid_request",
    "field": "amount"
}))]
pub struct ProblemBody {
    /// `urn:checkout:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    /// What went wrong, for a person.
    pub detail: String,
    /// `invalid_request`, `amount_conflict`, `in_flight`, `key_reuse`, `model_error`,
    /// `model_did_not_charge`, `unavailable`, `deadline_exceeded`, `not_found`.
    pub code: String,
    /// For `invalid_request`: the field, parameter or header at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For checkout failures: loop attempts made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// For model failures: requests sent for the round that failed.
    #[serde(rename = "requestAttempts", skip_serializing_if = "Option::is_none")]
    pub request_attempts: Option<u32>,
    /// For checkout failures: the retry layer that gave up (`request retry`, `loop retry`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
    /// For model failures: the provider's HTTP status.
    #[serde(rename = "upstreamStatus", skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    /// For checkout failures: whether the order is charged (null: unknown, the database
    /// could not be asked).
    #[serde(rename = "orderCharged", skip_serializing_if = "Option::is_none")]
    pub order_charged: Option<bool>,
    /// For checkout failures and `amount_conflict`: the order's receipt, when charged.
    #[serde(rename = "receiptId", skip_serializing_if = "Option::is_none")]
    pub receipt_id: Option<String>,
}

impl Problem {
    pub fn new(code: Code, detail: impl Into<String>) -> Self {
        Problem {
            code,
            detail: detail.into(),
            members: Map::new(),
            retry_after: None,
        }
    }

    /// A 400 naming the field, parameter or header at fault.
    pub fn invalid(field: &str, detail: impl Into<String>) -> Self {
        Problem::new(Code::InvalidRequest, detail).with("field", field)
    }

    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.members.insert(name.to_owned(), value.into());
        self
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub fn status(&self) -> StatusCode {
        self.code.status()
    }

    pub fn body(&self) -> Value {
        let mut body = Map::new();
        body.insert(
            "type".into(),
            format!("urn:checkout:problem:{}", self.code.as_str()).into(),
        );
        body.insert("title".into(), self.code.title().into());
        body.insert("status".into(), self.status().as_u16().into());
        body.insert("detail".into(), self.detail.clone().into());
        body.insert("code".into(), self.code.as_str().into());
        for (name, value) in &self.members {
            body.insert(name.clone(), value.clone());
        }
        Value::Object(body)
    }
}

impl Problem {
    /// The answer to send (and, for final outcomes, to save for replay).
    pub fn answer(self) -> Answer {
        if self.status().is_server_error() {
            tracing::error!(code = self.code.as_str(), detail = %self.detail, "request failed");
        }
        let mut answer = Answer::new(self.status(), PROBLEM_JSON, self.body().to_string());
        answer.retry_after = self.retry_after;
        answer.final_outcome = self.code.is_final();
        answer
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.answer().into_response()
    }
}
