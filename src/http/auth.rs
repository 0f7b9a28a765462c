//! The API key check in front of `/checkout` and `/receipts` (health, the API document,
//! Swagger UI and metrics stay open): a valid `Authorization: Bearer <key>` puts its
//! [`Caller`](crate::caller::Caller) in the request's extensions, so that Idempotency-Keys
//! and saved answers are scoped to it; a refusal is 401 `unauthorized` with
//! `WWW-Authenticate: Bearer`. The header's value is never logged (the router marks it
//! sensitive) and never part of an answer.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{Code, Problem};
use super::state::AppState;
use crate::caller::{AuthRefusal, Verdict};

pub async fn require_caller(
    State(app): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let sent = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes().to_vec());
    // Boxed: the check may ask the database, and its future would otherwise stay part of
    // this one, which lives as long as the request (thousands of loops wait at once).
    match Box::pin(app.gate().check(sent.as_deref())).await {
        Ok(Verdict::Caller(caller)) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Ok(Verdict::Open) => next.run(request).await,
        Ok(Verdict::Refused(why)) => {
            tracing::info!(reason = reason(why), "request refused: no valid API key");
            app.metrics().auth_failure(reason(why));
            unauthorized(why)
        }
        Err(err) => Problem::new(
            Code::Unavailable,
            format!("cannot check the API key: the database did not answer: {err}"),
        )
        .retry_after(1)
        .into_response(),
    }
}

fn reason(why: AuthRefusal) -> &'static str {
    match why {
        AuthRefusal::Missing => "missing",
        AuthRefusal::NotBearer => "not_bearer",
        AuthRefusal::Invalid => "invalid",
    }
}

/// The 401 for a refusal: `WWW-Authenticate: Bearer`, with `error="invalid_token"` when a
/// key was sent and is not valid (RFC 6750 §3).
pub fn unauthorized(why: AuthRefusal) -> Response {
    let mut response = Problem::unauthorized(why).into_response();
    let challenge = match why {
        AuthRefusal::Invalid => "Bearer error=\"invalid_token\"",
        AuthRefusal::Missing | AuthRefusal::NotBearer => "Bearer",
    };
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    response
}
