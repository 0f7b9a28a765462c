//! `POST /checkout`: validate, make the keys, run the assistant, answer.
//!
//! The handler and the run come first; the input it reads is in `input.rs`, the answer
//! it writes in `outcome.rs`, the error examples of the API document in `examples.rs`.

mod examples;
mod input;
mod outcome;

pub use examples::CheckoutErrors;
pub use input::CheckoutQuery;
pub(crate) use input::rebuild;
use input::{order, recipient};
pub use outcome::{CheckoutResponse, UsageView};
use outcome::{failure, paid_anyway, success};

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};

use crate::assistant::CheckoutContext;
use crate::caller::Caller;
use crate::http::admission::Slot;
use crate::http::answer::HttpAnswer;
use crate::http::error::Code;
use crate::http::extract::{Format, IdempotencyKey, NoBody, Params};
use crate::http::idempotent;
use crate::http::state::AppState;
use crate::idempotency::{Fingerprint, Lease};
use crate::outbox::{Confirmation, Recipient};
use crate::payments::{OperationKey, Order};

#[utoipa::path(
    post,
    path = "/checkout",
    tag = "checkout",
    summary = "Charge an order through the checkout assistant",
    description = "Runs the assistant loop: the model calls the `charge` tool, the gateway charges the order once (keyed by the order id), the model confirms. The order is given once, as query parameters; the operation reads no body (a body is refused with 400, or 413 over the body limit). Send `Accept: text/plain` for the confirmation sentence alone.",
    params(CheckoutQuery, IdempotencyKey),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The order is charged (now, or by an earlier operation)", content(
            (CheckoutResponse = "application/json"),
            (String = "text/plain", example = "Your payment of 42.50 USD for order A-100 went through; your receipt is 0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f.")
        )),
        CheckoutErrors,
    )
)]
pub async fn checkout(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    format: Format,
    IdempotencyKey(client_key): IdempotencyKey,
    Params(mut query): Params<CheckoutQuery>,
    _: NoBody,
) -> Response {
    let needs_method = app.gateway().needs_payment_method();
    let email = recipient(query.email.take());
    let checked = order(query, app.settings().payments.max_amount, needs_method)
        .and_then(|order| Ok((order, email?)));
    let (order, email) = match checked {
        Ok(checked) => checked,
        Err(problem) => {
            app.metrics().checkout(Code::InvalidRequest.as_str());
            return problem.into_response();
        }
    };
    // The operation is its caller's, keyed or not: a receipt records who paid.
    let caller = caller.map(|Extension(c)| c.0).unwrap_or_default();
    match client_key {
        Some(key) => {
            let mut fingerprint = Fingerprint::of_checkout(&order).with_email(email.as_ref());
            if format == Format::Text {
                // Kept with the request for the recovery sweep; not part of its identity.
                fingerprint = fingerprint.noting("accept", "text/plain");
            }
            let work = {
                let (app, key, caller) = (app.clone(), key.clone(), caller.clone());
                move |lease: &Lease, slot: Slot| {
                    let fence = Some(lease.fence);
                    async move {
                        let _slot = slot;
                        run(&app, order, email, key, &caller, fence, format).await
                    }
                }
            };
            // Boxed, like the failure path: a handler future is as large as its largest
            // branch, and thousands of checkouts wait at once.
            Box::pin(idempotent::once(&app, &caller, &key, &fingerprint, work)).await
        }
        None => {
            let Some(slot) = app.admission().try_admit() else {
                return app.admission().refusal().into_response();
            };
            let operation_key = OperationKey::mint();
            idempotent::detached(async move {
                let _slot = slot;
                run(&app, order, email, operation_key, &caller, None, format).await
            })
            .await
            .into_response()
        }
    }
}

/// Runs one checkout to its answer. Everything retried happens inside `assistant`. The
/// operation is `caller`'s, under its Idempotency-Key lease's `fence` if any.
pub(crate) async fn run(
    app: &AppState,
    order: Order,
    email: Option<Recipient>,
    operation_key: OperationKey,
    caller: &str,
    fence: Option<i64>,
    format: Format,
) -> HttpAnswer {
    let ctx = CheckoutContext::new(order, email, operation_key, caller, fence);
    let result = app.assistant().checkout(ctx.clone()).await;
    match result.or_else(|err| paid_anyway(&ctx, err)) {
        Ok(outcome) => {
            app.metrics().checkout("ok");
            // Asked for only when the request named an address, and boxed: the read's
            // future is some 14 KB, a copy into its box each checkout paid when it was
            // made whether or not there was anything to read.
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
async fn confirmation(app: &AppState, ctx: &CheckoutContext) -> Option<Confirmation> {
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
