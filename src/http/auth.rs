//! The API key check in front of `/checkout` and `/receipts` (health, the API document,
//! Swagger UI and metrics stay open): a valid `Authorization: Bearer <key>` puts its
//! [`Caller`] in the request's extensions, so that Idempotency-Keys
//! and saved answers are scoped to it, and its scopes checked ([`require`]); an open
//! service puts [`Caller::open`] there; a refusal is 401 `unauthorized` with
//! `WWW-Authenticate: Bearer`. The header's value is never logged (the router marks it
//! sensitive) and never part of an answer.
//!
//! A layer of its own rather than `axum::middleware::from_fn`: a request that needs no
//! look-up (the service open, or no key sent) goes straight to the route, and what waits
//! is the route's own future. Through `from_fn` every request carried the middleware's
//! future and its copies of the request for its whole life (bench figure 2).

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::{BoxFuture, Either};
use tower::util::Oneshot;
use tower::{Layer, Service, ServiceExt};

use super::error::{Code, Problem};
use super::state::AppState;
use crate::caller::{AuthRefusal, Caller, Scope, Verdict};

/// The check, as a layer over the callers' routes.
#[derive(Clone)]
pub struct RequireCaller(pub AppState);

impl<S> Layer<S> for RequireCaller {
    type Service = CallerCheck<S>;

    fn layer(&self, inner: S) -> CallerCheck<S> {
        CallerCheck {
            app: self.0.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct CallerCheck<S> {
    app: AppState,
    inner: S,
}

impl<S> Service<Request> for CallerCheck<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Pass<S>, BoxFuture<'static, Result<Response, Infallible>>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The inner service is driven ready by `oneshot`, on the clone that serves.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let inner = self.inner.clone();
        let sent = request.headers().get(header::AUTHORIZATION);
        match self.app.gate().verdict(sent.map(HeaderValue::as_bytes)) {
            Ok(verdict) => Either::Left(pass(&self.app, verdict, request, inner)),
            Err(key) => {
                let key = key.to_owned();
                let app = self.app.clone();
                Either::Right(Box::pin(async move {
                    match Box::pin(app.gate().look_up(&key)).await {
                        Ok(verdict) => pass(&app, verdict, request, inner).await,
                        Err(err) => Ok(Problem::unavailable(format!(
                            "cannot check the API key: the database did not answer: {err}"
                        ))
                        .into_response()),
                    }
                }))
            }
        }
    }
}

/// A request on its way to the route, or its refusal.
type Pass<S> = Either<Oneshot<S, Request>, Ready<Result<Response, Infallible>>>;

/// Serves `request` as the verdict says: as its caller's, as the anonymous caller's, or
/// not at all.
fn pass<S>(app: &AppState, verdict: Verdict, mut request: Request, inner: S) -> Pass<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    match verdict {
        Verdict::Caller(caller) => {
            request.extensions_mut().insert(caller);
            Either::Left(inner.oneshot(request))
        }
        Verdict::Open => {
            // Every scope, no limits of its own: the handlers take a `Caller` whatever the
            // mode. Small (no allocation for its empty name), inserted in place.
            request.extensions_mut().insert(Caller::open());
            Either::Left(inner.oneshot(request))
        }
        Verdict::Refused(why) => Either::Right(ready(Ok(refusal(app, why)))),
    }
}

/// The answer to a request the gate did not let through.
fn refusal(app: &AppState, why: AuthRefusal) -> Response {
    tracing::info!(reason = reason(why), "request refused: no valid API key");
    app.metrics().auth_failure(reason(why));
    unauthorized(why)
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

/// The 403 `forbidden` for a caller without `scope`, naming it; `None` when it has it.
pub fn require(caller: &Caller, scope: Scope) -> Option<Response> {
    if caller.has(scope) {
        return None;
    }
    tracing::info!(caller = %caller.name, scope = scope.as_str(), "request refused: the API key lacks the scope");
    Some(forbidden(scope).into_response())
}

/// The problem of a missing scope (also the API document's example).
pub fn forbidden(scope: Scope) -> Problem {
    Problem::new(
        Code::Forbidden,
        format!(
            "this API key does not carry the scope {scope:?} this operation needs (an operator makes one with `checkout api-keys create NAME --scope {scope}`)",
            scope = scope.as_str()
        ),
    )
}
