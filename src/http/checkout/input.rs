//! What a checkout request says: the order, given once, in the query string, checked
//! field by field; and the answer format the client asked for.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

use crate::http::error::Problem;
use crate::idempotency::Fingerprint;
use crate::outbox::Recipient;
use crate::payments::{Currency, Money, Order, OrderId, PaymentMethod};

/// The order to charge, as query parameters (as in the article:
/// `POST /checkout?orderId=A-100&amount=42.50`): the one place a checkout names it, so
/// each field is given once.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CheckoutQuery {
    /// The order id: 1–64 of `A-Z a-z 0-9 . _ : -`, starting with a letter or digit.
    // Optional to serde, required in the document: a missing one is the handler's 400
    // naming the field, not the query parser's.
    #[param(
        required = true,
        example = "A-100",
        min_length = 1,
        max_length = 64,
        pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
    )]
    #[serde(rename = "orderId")]
    order_id: Option<String>,
    /// The amount, a decimal > 0 with at most the currency's minor digits (0 for JPY and
    /// KRW, 3 for BHD and KWD, 2 for the others), at most the configured maximum: a
    /// plain decimal, no sign, no exponent, no separators. How many minor digits, and how
    /// large, depend on the currency and the settings, which a pattern cannot say.
    #[param(
        required = true,
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
    pub(super) email: Option<String>,
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

/// The currencies taken, from the list the handler checks against.
fn currency_schema() -> Schema {
    let codes = Currency::codes().map(serde_json::Value::from);
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(codes))
        .description(Some("ISO 4217 code; `USD` when not given"))
        .examples([serde_json::json!("USD")])
        .into()
}

/// The order the query names, field by field. `needs_method`: a payment provider takes
/// the payment.
pub(super) fn order(
    query: CheckoutQuery,
    max_amount: u64,
    needs_method: bool,
) -> Result<Order, Problem> {
    let order_id = query
        .order_id
        .ok_or_else(|| Problem::invalid("orderId", "orderId is required"))?;
    let order_id = OrderId::parse(&order_id)
        .map_err(|err| Problem::invalid("orderId", format!("orderId {err}")))?;
    let currency = match query.currency {
        Some(code) => Currency::parse(&code)
            .map_err(|err| Problem::invalid("currency", format!("currency: {err}")))?,
        None => Currency::USD,
    };
    let amount = query
        .amount
        .ok_or_else(|| Problem::invalid("amount", "amount is required"))?;
    let amount = Money::parse(&amount, currency)
        .and_then(|m| m.at_most(max_amount))
        .map_err(|err| Problem::invalid("amount", format!("amount {err}")))?;
    let method = query
        .payment_method
        .map(|m| PaymentMethod::parse(&m))
        .transpose()
        .map_err(|err| Problem::invalid("paymentMethod", format!("paymentMethod {err}")))?;
    if needs_method && method.is_none() {
        return Err(Problem::invalid(
            "paymentMethod",
            "paymentMethod is required with the payment provider (a pm_… id, e.g. pm_card_visa)",
        ));
    }
    // The one place an Order is made (clippy.toml): from the client's request, checked.
    #[allow(clippy::disallowed_methods, reason = "the handler's validation")]
    let order = Order::new(order_id, amount);
    Ok(order.with_payment_method(method))
}

/// A checkout as the handler took it, checked: what every run of its operation starts
/// from (the client's, a resume after a person's approval, the recovery sweep's).
#[derive(Debug)]
pub struct CheckoutRequest {
    pub order: Order,
    pub email: Option<Recipient>,
    pub format: Format,
    /// The charge waits for a person's approval: decided when the request was taken
    /// (the amount against the caller's threshold then), kept with it.
    pub needs_approval: bool,
}

impl CheckoutRequest {
    /// The request's identity and, kept beside it for a resume, what does not make it
    /// another request (the answer's format, the approval the handler required).
    pub fn fingerprint(&self) -> Fingerprint {
        let mut fingerprint = Fingerprint::of_checkout(&self.order).with_email(self.email.as_ref());
        if self.format == Format::Text {
            fingerprint = fingerprint.noting("accept", "text/plain");
        }
        if self.needs_approval {
            fingerprint = fingerprint.noting("approval", "required");
        }
        fingerprint
    }
}

/// A request as its Idempotency-Key record keeps it ([`Fingerprint::request`]), checked
/// again as the handler checks it: what a resume runs.
pub(crate) fn rebuild(request: &str, max_amount: u64) -> Result<CheckoutRequest, String> {
    let mut fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(request).map_err(|err| err.to_string())?;
    let format = match fields.remove("accept") {
        Some(accept) if accept == "text/plain" => Format::Text,
        _ => Format::Json,
    };
    let needs_approval = fields.remove("approval").is_some_and(|a| a == "required");
    let mut query: CheckoutQuery =
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(|err| err.to_string())?;
    let email = recipient(query.email.take()).map_err(|p| p.body.detail.clone())?;
    // The method was required, or not, when the request was first taken.
    let order = order(query, max_amount, false).map_err(|p| p.body.detail)?;
    Ok(CheckoutRequest {
        order,
        email,
        format,
        needs_approval,
    })
}

/// The customer's address, if the query names one.
pub(super) fn recipient(query: Option<String>) -> Result<Option<Recipient>, Problem> {
    query
        .map(|text| {
            Recipient::parse(&text).map_err(|err| Problem::invalid("email", format!("email {err}")))
        })
        .transpose()
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
