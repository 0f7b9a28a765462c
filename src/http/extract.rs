//! Extractors whose rejections are our problem+json, naming what was at fault: the
//! query, the body, the answer format asked for, the `Idempotency-Key`.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;
use utoipa::IntoParams;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::{ObjectBuilder, Required, Type};

use super::error::{Code, Problem};
use crate::payments::OperationKey;

/// Query parameters, strictly: an unknown or malformed one is a 400 naming `query`.
pub struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(params)| Params(params))
            .map_err(|err| Problem::invalid("query", err.body_text()))
    }
}

/// No body: an operation whose input is all in its query string reads none, so that
/// each field is given once. A body over the limit is 413 `content_too_large`; any other
/// body is a 400 naming `body`. Nothing was run or recorded either way.
pub struct NoBody;

impl<S: Send + Sync> FromRequest<S> for NoBody {
    type Rejection = Problem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Problem> {
        let body = Bytes::from_request(request, state).await.map_err(|err| {
            if err.status() == StatusCode::PAYLOAD_TOO_LARGE {
                return Problem::new(
                    Code::ContentTooLarge,
                    "the request body is larger than this service takes (CHECKOUT_BODY_LIMIT_BYTES); nothing was run or recorded",
                );
            }
            Problem::invalid("body", format!("cannot read the body: {}", err.body_text()))
        })?;
        if body.is_empty() {
            return Ok(NoBody);
        }
        Err(Problem::invalid(
            "body",
            "this operation reads no body: give the order as query parameters (?orderId=…&amount=…), once; nothing was run or recorded",
        ))
    }
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
        let (mut json, mut text) = (0.0_f32, 0.0_f32);
        for (media, q) in accept_ranges(headers) {
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

pub const HEADER: &str = "idempotency-key";

/// What the header may hold, as [`IdempotencyKey`] reads it: a bare token of printable
/// ASCII, or a structured-field string whose content (`\"` and `\\` escaped) is that.
const PATTERN: &str = r#"^([!#-~]([ -~]{0,253}[!-~])?|"([ !#-\[\]-~]|\\["\\]){1,255}")$"#;

/// The client's `Idempotency-Key`, if it sent one: a structured-field string (`"…"`,
/// RFC 8941) as the IETF draft has it, or a bare token, which many clients send.
#[derive(Debug)]
pub struct IdempotencyKey(pub Option<OperationKey>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        let mut values = parts.headers.get_all(HEADER).iter();
        let Some(value) = values.next() else {
            return Ok(IdempotencyKey(None));
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
                        '\\' => match chars.next() {
                            Some(escaped @ ('"' | '\\')) => key.push(escaped),
                            _ => {
                                return Err(invalid(
                                    "Idempotency-Key has a bad escape; only \\\" and \\\\ are allowed"
                                        .into(),
                                ));
                            }
                        },
                        '"' => {
                            return Err(invalid("Idempotency-Key has an unescaped quote".into()));
                        }
                        c => key.push(c),
                    }
                }
                key
            }
            None => text.to_owned(),
        };
        OperationKey::from_client(&key)
            .map(|key| IdempotencyKey(Some(key)))
            .map_err(|err| invalid(format!("Idempotency-Key {err}")))
    }
}

impl IntoParams for IdempotencyKey {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .pattern(Some(PATTERN))
            .examples([serde_json::json!("\"order-A-100\"")]);
        vec![
            ParameterBuilder::new()
                .name("Idempotency-Key")
                .parameter_in(ParameterIn::Header)
                .required(Required::False)
                .description(Some(
                    "Makes a retried POST safe to send: the same key with the same order replays the first answer. A structured-field string (`\"k-1\"`) or a bare token, 1–255 printable ASCII characters.",
                ))
                .schema(Some(schema))
                .build(),
        ]
    }
}

/// The media ranges of every `Accept` header, each lower-cased with its quality (`q`,
/// 1 when not given), in the order sent.
pub fn accept_ranges(headers: &axum::http::HeaderMap) -> impl Iterator<Item = (String, f32)> {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let q = parts
                .find_map(|p| p.strip_prefix("q="))
                .and_then(|q| q.parse::<f32>().ok())
                .unwrap_or(1.0);
            (media, q)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue, Request};

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

    async fn key(value: Option<&str>) -> Result<Option<String>, Problem> {
        let mut request = Request::builder();
        if let Some(value) = value {
            request = request.header(HEADER, value);
        }
        let (mut parts, ()) = request.body(()).unwrap().into_parts();
        IdempotencyKey::from_request_parts(&mut parts, &())
            .await
            .map(|IdempotencyKey(key)| key.map(|k| k.to_string()))
    }

    #[tokio::test]
    async fn idempotency_keys_are_sf_strings_or_tokens() {
        assert_eq!(key(Some("\"k-1\"")).await.unwrap().unwrap(), "k-1");
        assert_eq!(
            key(Some("\"a \\\"b\\\" \\\\c\"")).await.unwrap().unwrap(),
            "a \"b\" \\c"
        );
        assert_eq!(key(Some("k-1")).await.unwrap().unwrap(), "k-1");
        assert!(key(Some("\"open")).await.is_err());
        assert!(key(Some("\"\"")).await.is_err());
        assert!(key(Some(&"x".repeat(256))).await.is_err());
        assert!(key(None).await.unwrap().is_none());
    }
}
