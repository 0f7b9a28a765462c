//! `POST /checkout`: validate, make the keys, run the assistant, answer.
//!
//! The handler and the run come first; the input it reads is in `input.rs`, the answer
//! it writes in `outcome.rs`, the error examples of the API document in `examples.rs`.

mod examples;
pub(crate) mod input;
mod outcome;

pub use crate::http::operation::CheckoutRequest;
pub use crate::http::views::UsageView;
pub use examples::CheckoutErrors;
pub use input::CheckoutQuery;
use input::{order, recipient};
pub use outcome::CheckoutResponse;
use outcome::{failure, paid_anyway, success};

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use crate::assistant::OperationContext;
use crate::caller::{Caller, Scope};
use crate::http::admission::Slot;
use crate::http::answer::HttpAnswer;
use crate::http::auth::require;
use crate::http::error::Code;
use crate::http::extract::{Format, IdempotencyKey, NoBody, Params};
use crate::http::idempotent;
use crate::http::operation::OperationRef;
use crate::http::paused;
use crate::http::state::AppState;
use crate::http::stream;
use crate::idempotency::Lease;
use crate::outbox::Confirmation;
use crate::payments::OperationKey;

#[utoipa::path(
    post,
    path = "/checkout",
    tag = "checkout",
    summary = "Charge an order through the checkout assistant",
    description = "Runs the assistant loop: the model calls the `charge` tool, the gateway charges the order once (keyed by the order id), the model confirms. The order is given once, as query parameters; the operation reads no body (a body is refused with 400, or 413 over the body limit). Send `Accept: text/plain` for the confirmation sentence alone, or `Accept: text/event-stream` for the operation's steps as AG-UI events as they happen (docs/streaming.md; keyed by a minted key without an Idempotency-Key, resumable at `GET /operations/{operationKey}/events`). Needs the API key scope `checkout`.",
    params(CheckoutQuery, IdempotencyKey),
    security(("api_key" = ["checkout"])),
    responses(
        (status = 200, description = "The order is charged (now, or by an earlier operation)", content(
            (CheckoutResponse = "application/json"),
            (String = "text/plain", example = "Your payment of 42.50 USD for order A-100 went through; your receipt is 0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f.")
        )),
        CheckoutErrors,
    )
)]
pub fn checkout(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    format: Format,
    IdempotencyKey(client_key): IdempotencyKey,
    Params(query): Params<CheckoutQuery>,
    stream::Wanted(streamed): stream::Wanted,
    _: NoBody,
) -> Started {
    if let Some(refusal) = require(&caller, Scope::Checkout) {
        return Started::Answered(Some(refusal));
    }
    // A stream's run is its operation key.
    start(
        app,
        caller,
        format,
        client_key,
        query,
        streamed.then(String::new),
    )
}

/// A checkout the caller may make: validated, keyed and run, answered as JSON or text,
/// or (`run_id` given; empty: the operation key) as the run `run_id` of AG-UI events.
///
/// Not an `async fn`, nor is the handler: everything before the wait is done here, at
/// once, and what is left to wait on is [`Started`], a few words. An `async fn` keeps
/// its arguments in its future as long as it runs, and is as large as its largest
/// branch: as one (the stream's branch inline, the handler's copies of the query and of
/// the request's headers) every waiting checkout held them all (figure 2,
/// docs/benchmark.md).
pub(crate) fn start(
    app: AppState,
    caller: Caller,
    format: Format,
    client_key: Option<OperationKey>,
    mut query: CheckoutQuery,
    run_id: Option<String>,
) -> Started {
    let needs_method = app.gateway().needs_payment_method();
    let email = recipient(query.email.take());
    let checked = order(query, app.settings().payments.max_amount, needs_method)
        .and_then(|order| Ok((order, email?)));
    let (order, email) = match checked {
        Ok(checked) => checked,
        Err(problem) => {
            app.metrics().checkout(Code::InvalidRequest.as_str());
            return Started::Answered(Some(problem.into_response()));
        }
    };
    // Above the caller's threshold the charge waits for a person: decided here, from the
    // order the client authorized, and kept with the request for every resume.
    let needs_approval =
        caller.needs_approval(&app.settings().payments.approval_above, order.amount());
    // A stream's last event carries the JSON form's answer.
    let streamed = run_id.is_some();
    let request = CheckoutRequest {
        order,
        email,
        format: if streamed { Format::Json } else { format },
        needs_approval,
    };
    // A checkout that may pause is keyed, by the client or by a key minted here: its
    // pause is rows (its record and journal), which a decision on any instance resumes.
    // So is a streamed one: its events are read from its journal (docs/streaming.md).
    let key = client_key.or_else(|| (needs_approval || streamed).then(OperationKey::mint));
    match key {
        Some(key) => {
            let fingerprint = OperationRef::Checkout(&request).fingerprint();
            let work = {
                let (app, key, caller) = (app.clone(), key.clone(), caller.clone());
                // The slot is let go when the run ends: a block that awaited the run
                // would hold what it captured beside it.
                move |lease: &Lease, slot: Slot| {
                    run(&app, request, key, &caller, Some(lease.fence)).map(move |answer| {
                        drop(slot);
                        answer
                    })
                }
            };
            if let Some(run_id) = run_id {
                let run_id = match run_id.is_empty() {
                    true => key.as_str().to_owned(),
                    false => run_id,
                };
                return Started::Boxed(Box::pin(stream::once(
                    app,
                    caller.name.clone(),
                    key,
                    fingerprint,
                    run_id,
                    work,
                )));
            }
            // Boxed, like the failure path: a handler future is as large as its largest
            // branch, and thousands of checkouts wait at once.
            Started::Boxed(Box::pin(idempotent::once(
                app,
                caller.name,
                key,
                fingerprint,
                work,
            )))
        }
        None => {
            let Some(slot) = app.admission().try_admit() else {
                return Started::Answered(Some(app.admission().refusal().into_response()));
            };
            let operation_key = OperationKey::mint();
            let run = run(&app, request, operation_key, &caller, None);
            Started::Detached(idempotent::detached(run.map(move |answer| {
                drop(slot);
                answer
            })))
        }
    }
}

/// A checkout started: its answer already, or the work it waits on, boxed.
pub enum Started {
    /// `None` once it has answered.
    Answered(Option<Response>),
    /// A keyless checkout: its work, boxed, polled by the request.
    Detached(idempotent::Detached),
    /// A keyed or streamed one.
    Boxed(BoxFuture<'static, Response>),
}

impl Future for Started {
    type Output = Response;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response> {
        match self.get_mut() {
            Started::Answered(answer) => {
                Poll::Ready(answer.take().expect("polled after it answered"))
            }
            Started::Detached(work) => Pin::new(work).poll(cx).map(IntoResponse::into_response),
            Started::Boxed(work) => work.as_mut().poll(cx),
        }
    }
}

/// Runs one checkout to its answer. Everything retried happens inside `assistant`. The
/// operation is `caller`'s, under its Idempotency-Key lease's `fence` if any.
///
/// Not an `async fn`: the request is made into the checkout's context here, at once, and
/// the future returned holds the context (one `Arc`), not the request, the keys and the
/// caller it was made from, which an `async fn` keeps for as long as it runs (bench
/// figures 2 and 12: every waiting checkout holds this future).
pub(crate) fn run(
    app: &AppState,
    request: CheckoutRequest,
    operation_key: OperationKey,
    caller: &Caller,
    fence: Option<i64>,
) -> impl Future<Output = HttpAnswer> + Send + use<> {
    let CheckoutRequest {
        order,
        email,
        format,
        needs_approval,
    } = request;
    let budget = caller.budget_per_day(&app.settings().payments, order.amount().currency());
    let mut ctx =
        OperationContext::new(order, email, operation_key, &caller.name, fence).with_budget(budget);
    if needs_approval {
        ctx = ctx.needing_approval();
    }
    let app = app.clone();
    async move { finish(&app, ctx, format).await }
}

/// The checkout `ctx` run to its answer, written in `format`.
async fn finish(app: &AppState, ctx: OperationContext, format: Format) -> HttpAnswer {
    let result = app.assistant().run(ctx.clone()).await;
    if let Err(err) = &result
        && let Some(found) = err.kind.approval()
    {
        let found = found.cloned();
        return Box::pin(paused::pause(app, &ctx, found)).await;
    }
    match result.or_else(|err| paid_anyway(&ctx, err)) {
        Ok(outcome) => {
            app.metrics().checkout("ok");
            // Asked for only when the request named an address, and boxed: the read's
            // future is a database statement's, a copy into its box each checkout paid
            // when it was made whether or not there was anything to read (figure 7).
            let confirmation = match ctx.email() {
                Some(_) => Box::pin(confirmation(app, &ctx)).await,
                None => None,
            };
            success(&ctx, outcome, confirmation, format)
        }
        Err(err) => {
            let problem = Box::pin(failure(app, &ctx, err)).await;
            app.metrics().checkout(problem.body.code.as_str());
            problem.answer()
        }
    }
}

/// The operation's confirmation email as it stands (the request named an address).
async fn confirmation(app: &AppState, ctx: &OperationContext) -> Option<Confirmation> {
    let key = ctx.journal_key();
    match app
        .outbox()
        .confirmation(&key.caller, &key.operation_key)
        .await
    {
        Ok(confirmation) => confirmation,
        Err(err) => {
            tracing::warn!(error = %err, "cannot read the confirmation's outbox row; the answer leaves it out");
            None
        }
    }
}
