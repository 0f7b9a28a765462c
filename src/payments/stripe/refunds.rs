//! Refunds at the provider: `POST /v1/refunds` with the payment intent, under the refund's
//! key (sent with every retry, the same form each time: Stripe refunds once and answers
//! every repeat with its saved result), and `GET /v1/refunds?payment_intent=…` to settle
//! a refund whose answer was lost, by the refund key it carries in its metadata.

use bytes::Bytes;
use serde_json::Value;
use tower::ServiceExt;

use super::wire::{Call, ProviderResponse, Request, describe, status_error};
use super::{ProviderError, Stripe};

/// A refund to send: its key and parameters, all from the refund's row.
#[derive(Clone, Debug)]
pub struct RefundCall<'a> {
    /// The Idempotency-Key, also in the metadata (`refund_key`).
    pub key: &'a str,
    pub payment_intent: &'a str,
    pub amount_minor: i64,
    pub order_id: &'a str,
}

/// What the provider did with a refund.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefundAnswer {
    /// Made (Stripe's `succeeded` or `pending`: the money is on its way back).
    Made { refund_id: String },
    /// Refused: nothing was refunded (`failed`, `canceled`, or a 4xx such as
    /// `charge_already_refunded`).
    Refused { code: String, message: String },
}

impl Stripe {
    /// Sends the refund under its key, retried with the same key; when no retry brought
    /// an outcome, looks it up among the intent's refunds.
    pub async fn refund(&self, refund: &RefundCall<'_>) -> Result<RefundAnswer, ProviderError> {
        let mut form = reqwest::Url::parse("http://form/").expect("a valid URL");
        form.query_pairs_mut()
            .append_pair("payment_intent", refund.payment_intent)
            .append_pair("amount", &refund.amount_minor.to_string())
            .append_pair("metadata[order_id]", refund.order_id)
            .append_pair("metadata[refund_key]", refund.key);
        let call = Call {
            request: Request::Refund {
                key: refund.key.into(),
                form: Bytes::from(form.query().unwrap_or_default().to_owned()),
            },
        };
        let failure = match self.stack.clone().oneshot(call).await {
            Ok(reply) => match answered(&reply, refund.key) {
                Err(ProviderError::Unavailable(why)) => why,
                other => return other,
            },
            Err(err) => describe(&err),
        };
        tracing::warn!(order = refund.order_id, failure = %failure, "payment provider: no outcome of the refund after the provider retry; looking it up among the intent's refunds");
        match self.find_refund(refund).await? {
            Some(answer) => Ok(answer),
            None => Err(ProviderError::Unavailable(format!(
                "{failure}; no refund with this key is listed for the payment yet"
            ))),
        }
    }

    /// The intent's refund that carries this refund's key in its metadata, if any.
    pub async fn find_refund(
        &self,
        refund: &RefundCall<'_>,
    ) -> Result<Option<RefundAnswer>, ProviderError> {
        let call = Call {
            request: Request::ListRefunds {
                payment_intent: refund.payment_intent.into(),
            },
        };
        let reply = self
            .stack
            .clone()
            .oneshot(call)
            .await
            .map_err(|err| ProviderError::Unavailable(describe(&err)))?;
        if reply.status != 200 {
            return Err(status_error(&reply));
        }
        let body = reply.json()?;
        let found = body["data"].as_array().and_then(|refunds| {
            refunds
                .iter()
                .find(|r| r["metadata"]["refund_key"] == refund.key)
        });
        found.map(of_refund).transpose()
    }
}

/// What a `POST /v1/refunds` answer says.
fn answered(reply: &ProviderResponse, key: &str) -> Result<RefundAnswer, ProviderError> {
    let body = reply.json();
    match reply.status {
        200 => of_refund(&body?),
        400 if body
            .as_ref()
            .is_ok_and(|b| b["error"]["type"] == "idempotency_error") =>
        {
            let message = body
                .ok()
                .and_then(|b| b["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_default();
            tracing::error!(provider_key = key, message = %message, "BUG: the payment provider says this refund's Idempotency-Key was first sent with other parameters");
            Err(ProviderError::ParametersDiffer {
                key: key.to_owned(),
                message,
            })
        }
        400 | 402 => {
            let body = body.unwrap_or_default();
            let error = &body["error"];
            Ok(RefundAnswer::Refused {
                code: error["code"]
                    .as_str()
                    .or(error["type"].as_str())
                    .unwrap_or("refused")
                    .to_owned(),
                message: error["message"].as_str().unwrap_or_default().to_owned(),
            })
        }
        _ => Err(status_error(reply)),
    }
}

/// A Refund object's outcome.
fn of_refund(refund: &Value) -> Result<RefundAnswer, ProviderError> {
    let id = refund["id"]
        .as_str()
        .ok_or_else(|| ProviderError::Malformed("a refund without an id".into()))?
        .to_owned();
    match refund["status"].as_str().unwrap_or_default() {
        "succeeded" | "pending" | "requires_action" => Ok(RefundAnswer::Made { refund_id: id }),
        status => Ok(RefundAnswer::Refused {
            code: status.to_owned(),
            message: refund["failure_reason"]
                .as_str()
                .unwrap_or("the refund did not go through")
                .to_owned(),
        }),
    }
}
