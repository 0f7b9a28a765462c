//! Extractors whose rejections are our problem+json, naming what was at fault.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
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
