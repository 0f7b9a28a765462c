//! Extractors whose rejections are our problem+json, naming what was at fault.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use super::error::{Code, Problem};

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

/// An optional JSON body: no body, or `null`, is `T::default()`; a body must be JSON and
/// a `T`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = Problem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Problem> {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
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
            return Ok(JsonBody(T::default()));
        }
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
                    "a request body must be application/json, not {content_type:?}; or send the order as query parameters"
                ),
            ));
        }
        serde_json::from_slice::<Option<T>>(&body)
            .map(|body| JsonBody(body.unwrap_or_default()))
            .map_err(|err| {
                Problem::invalid(
                    "body",
                    format!("the JSON body does not fit the schema: {err}"),
                )
            })
    }
}
