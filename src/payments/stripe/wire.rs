//! What is sent to the payment provider and what its responses say: the request of one
//! call, the raw response, and the outcome read from it.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tower::BoxError;

use super::{PaymentOutcome, ProviderError};

/// What a `POST /v1/payment_intents` response says.
pub(super) fn created(
    response: &ProviderResponse,
    key: &str,
) -> Result<PaymentOutcome, ProviderError> {
    match response.status {
        200 => of_intent(&response.json()?),
        402 => {
            let body = response.json()?;
            let error = &body["error"];
            let payment = &error["payment_intent"];
            Ok(PaymentOutcome::Declined {
                payment_id: payment["id"].as_str().map(str::to_owned),
                decline_code: error["decline_code"]
                    .as_str()
                    .or(error["code"].as_str())
                    .unwrap_or("card_declined")
                    .to_owned(),
                message: error["message"].as_str().unwrap_or_default().to_owned(),
            })
        }
        400 if error_type(response) == Some("idempotency_error".into()) => {
            let message = response
                .json()
                .ok()
                .and_then(|b| b["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_default();
            tracing::error!(
                provider_key = key,
                message = %message,
                "BUG: the payment provider says this Idempotency-Key was first sent with other parameters; a key is only ever sent with its intent's parameters. Nothing further is sent for it"
            );
            Err(ProviderError::ParametersDiffer {
                key: key.to_owned(),
                message,
            })
        }
        _ => Err(status_error(response)),
    }
}

/// A PaymentIntent object's outcome.
pub(super) fn of_intent(payment: &Value) -> Result<PaymentOutcome, ProviderError> {
    let id = payment["id"]
        .as_str()
        .ok_or_else(|| ProviderError::Malformed("a payment intent without an id".into()))?
        .to_owned();
    let last_error = &payment["last_payment_error"];
    match payment["status"].as_str().unwrap_or_default() {
        "succeeded" => Ok(PaymentOutcome::Succeeded { payment_id: id }),
        "requires_action" => Ok(PaymentOutcome::RequiresAction { payment_id: id }),
        "requires_payment_method" | "canceled" => Ok(PaymentOutcome::Declined {
            payment_id: Some(id),
            decline_code: last_error["decline_code"]
                .as_str()
                .or(last_error["code"].as_str())
                .unwrap_or("canceled")
                .to_owned(),
            message: last_error["message"]
                .as_str()
                .unwrap_or("the payment did not go through")
                .to_owned(),
        }),
        other => Err(ProviderError::Unavailable(format!(
            "payment {id} is {other:?}, not yet settled"
        ))),
    }
}

fn error_type(response: &ProviderResponse) -> Option<String> {
    let body = response.json().ok()?;
    body["error"]["type"].as_str().map(str::to_owned)
}

pub(super) fn status_error(response: &ProviderResponse) -> ProviderError {
    let body = response.json().unwrap_or_default();
    let error = &body["error"];
    let code = error["code"]
        .as_str()
        .or(error["type"].as_str())
        .unwrap_or_default()
        .to_owned();
    let message = error["message"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| {
            String::from_utf8_lossy(&response.body[..response.body.len().min(200)]).into()
        });
    match response.status {
        409 | 429 | 500.. => ProviderError::Unavailable(format!(
            "the payment provider answered {} {code}: {message}",
            response.status
        )),
        status => ProviderError::Refused {
            status,
            code,
            message,
        },
    }
}

pub(super) fn describe(err: &BoxError) -> String {
    if err.is::<tower::timeout::error::Elapsed>() {
        "the payment provider did not answer in time".into()
    } else {
        format!("the payment provider could not be reached: {err}")
    }
}

/// One request of the unit the provider retry repeats.
#[derive(Clone)]
pub(super) struct Call {
    pub(super) request: Request,
}

#[derive(Clone)]
pub(super) enum Request {
    Create {
        key: Arc<str>,
        form: Bytes,
    },
    Search {
        query: Arc<str>,
    },
    /// `POST /v1/refunds` under the refund's key.
    Refund {
        key: Arc<str>,
        form: Bytes,
    },
    /// `GET /v1/refunds?payment_intent=…`: the intent's refunds.
    ListRefunds {
        payment_intent: Arc<str>,
    },
}

impl Call {
    pub(super) fn operation(&self) -> &'static str {
        match self.request {
            Request::Create { .. } => "create",
            Request::Search { .. } => "search",
            Request::Refund { .. } => "refund",
            Request::ListRefunds { .. } => "list_refunds",
        }
    }
}

/// The provider's HTTP response: the retry policy and the caller read the status.
#[derive(Debug)]
pub(super) struct ProviderResponse {
    pub(super) status: u16,
    pub(super) body: Bytes,
}

impl ProviderResponse {
    pub(super) fn json(&self) -> Result<Value, ProviderError> {
        serde_json::from_slice(&self.body).map_err(|err| {
            ProviderError::Malformed(format!("{err}: {}", String::from_utf8_lossy(&self.body)))
        })
    }

    /// The metrics outcome of a response.
    pub(super) fn outcome(&self) -> &'static str {
        let status = self.json().ok();
        let field = |path: [&str; 2]| {
            status
                .as_ref()
                .and_then(|b| b[path[0]][path[1]].as_str().map(str::to_owned))
        };
        match self.status {
            200 => match status.as_ref().and_then(|b| b["status"].as_str()) {
                Some("succeeded") => "succeeded",
                Some("requires_action") => "requires_action",
                Some(_) => "other",
                None if status.is_some() => "answered",
                None => "malformed",
            },
            402 => "declined",
            409 => "in_use",
            400 if field(["error", "type"]).as_deref() == Some("idempotency_error") => {
                "idempotency_error"
            }
            500.. => "server_error",
            _ => "refused",
        }
    }
}
