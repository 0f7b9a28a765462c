//! `POST /refunds`: validate, authorize the order and amount against its receipt, make
//! the keys, run the assistant with its `refund` tool, answer.
//!
//! The refund key is the operation key (the Idempotency-Key, else a UUIDv7 minted here):
//! one refund per operation. The handler authorizes what may be refunded (404
//! `not_charged`, 409 `refund_exceeds_charge`); the database holds the sum of an order's
//! refunds within its charge whatever runs at once (`payments::store::refunds`).

mod input;
mod outcome;

pub use crate::http::operation::RefundRequest;
pub use crate::http::views::RefundView;
pub use input::{RefundInput, RefundQuery};
pub use outcome::{RefundErrors, RefundResponse};

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};

use crate::assistant::OperationContext;
use crate::caller::{Caller, Scope};
use crate::http::admission::Slot;
use crate::http::answer::HttpAnswer;
use crate::http::auth::require;
use crate::http::error::{Code, Problem};
use crate::http::extract::Format;
use crate::http::extract::IdempotencyKey;
use crate::http::idempotent;
use crate::http::operation::{OperationRef, answered};
use crate::http::paused;
use crate::http::state::AppState;
use crate::idempotency::Lease;
use crate::payments::{Effect, Money, OperationKey, Order, Receipt};

#[utoipa::path(
    post,
    path = "/refunds",
    tag = "checkout",
    summary = "Refund an order through the checkout assistant",
    description = "Runs the assistant loop with a `refund` tool instead of `charge`: the handler authorizes the order and the amount (default: what is left of its charge), the gateway refunds once per operation (keyed by the Idempotency-Key, or a key minted here), the model confirms. The refund is given as query parameters (a JSON body with the same names is taken too, instead of them, never beside them). The sum of an order's refunds never passes its charge, whatever runs at once. Needs the API key scope `refund`.",
    params(RefundQuery, IdempotencyKey),
    security(("api_key" = ["refund"])),
    responses(
        (status = 200, description = "The refund is made (now, or by an earlier run of this operation)", content(
            (RefundResponse = "application/json"),
            (String = "text/plain", example = "Your refund of 20.00 USD for order A-100 is made; your refund is 0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e70.")
        )),
        RefundErrors,
    )
)]
pub async fn refund(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    format: Format,
    IdempotencyKey(client_key): IdempotencyKey,
    RefundInput(query): RefundInput,
) -> Response {
    if let Some(refusal) = require(&caller, Scope::Refund) {
        return refusal;
    }
    let checked = match input::check(query) {
        Ok(checked) => checked,
        Err(problem) => {
            answered(&app, Effect::Refund, Code::InvalidRequest.as_str());
            return problem.into_response();
        }
    };
    let authorized = Box::pin(authorize(&app, &caller, client_key.as_ref(), &checked)).await;
    let (order, email) = match authorized {
        Ok(authorized) => authorized,
        Err(problem) => return problem.into_response(),
    };
    // Above the caller's threshold the refund waits for a person, as a charge does.
    let needs_approval =
        caller.needs_approval(&app.settings().payments.approval_above, order.amount());
    let request = RefundRequest {
        order,
        asked: checked.amount,
        reason: checked.reason,
        email_from_receipt: checked.email.is_none() && email.is_some(),
        email,
        format,
        needs_approval,
    };
    let fingerprint = OperationRef::Refund(&request).fingerprint();
    // A refund that may pause is keyed: its pause is rows.
    match client_key.or_else(|| needs_approval.then(OperationKey::mint)) {
        Some(key) => {
            let work = {
                let (app, key, caller) = (app.clone(), key.clone(), caller.clone());
                move |lease: &Lease, slot: Slot| {
                    let fence = Some(lease.fence);
                    async move {
                        let _slot = slot;
                        run(&app, request, key, &caller, fence).await
                    }
                }
            };
            Box::pin(idempotent::once(
                app.clone(),
                caller.name.clone(),
                key,
                fingerprint,
                work,
            ))
            .await
        }
        None => {
            let Some(slot) = app.admission().try_admit() else {
                return app.admission().refusal().into_response();
            };
            let operation_key = OperationKey::mint();
            idempotent::detached(async move {
                let _slot = slot;
                run(&app, request, operation_key, &caller, None).await
            })
            .await
            .into_response()
        }
    }
}

/// The refund the request may make: the order charged (and readable by this caller), the
/// amount asked or what is left, within what is left (unless this operation's refund is
/// made already: a retry finds it); and where to confirm it.
async fn authorize(
    app: &AppState,
    caller: &Caller,
    key: Option<&OperationKey>,
    checked: &input::Checked,
) -> Result<(Order, Option<crate::outbox::Recipient>), Problem> {
    let order_id = &checked.order_id;
    let unavailable = |err: crate::db::StoreError| {
        Problem::unavailable(format!("cannot read the order's charge: {err}"))
    };
    let not_charged = || {
        Problem::new(
            Code::NotCharged,
            format!(
                "order {order_id} has no receipt: it has not been charged; nothing was refunded"
            ),
        )
    };
    let receipt = app
        .gateway()
        .receipt(order_id)
        .await
        .map_err(unavailable)?
        .filter(|r: &Receipt| r.caller == caller.name || caller.has(Scope::Read))
        .ok_or_else(not_charged)?;
    let currency = receipt.amount.currency();
    let refunds = app.gateway().refunds();
    let made = match key {
        Some(key) => refunds
            .by_operation(&caller.name, key.as_str())
            .await
            .map_err(unavailable)?,
        None => None,
    };
    let state = refunds
        .refunded(order_id)
        .await
        .map_err(unavailable)?
        .ok_or_else(not_charged)?;
    let amount = match (&checked.amount, &made) {
        (Some(text), _) => Money::parse(text, currency)
            .map_err(|err| Problem::invalid("amount", format!("amount {err}")))?,
        (None, Some(made)) => made.amount,
        (None, None) => match state.left() {
            Some(left) => left,
            None => return Err(exceeds(&receipt, &state, None)),
        },
    };
    if made.is_none() && amount.minor() > state.left_minor() {
        return Err(exceeds(&receipt, &state, Some(amount)));
    }
    let email = match &checked.email {
        Some(email) => Some(email.clone()),
        None => app
            .outbox()
            .address_of(&receipt)
            .await
            .map_err(unavailable)?,
    };
    // The one place a refund's Order is made: from the client's request, checked against
    // the order's receipt.
    #[allow(clippy::disallowed_methods, reason = "the handler's validation")]
    let order = Order::new(order_id.clone(), amount);
    Ok((order, email))
}

/// 409 `refund_exceeds_charge`: what is left to refund of the order's charge.
pub(crate) fn exceeds(
    receipt: &Receipt,
    state: &crate::payments::store::Refunded,
    asked: Option<Money>,
) -> Problem {
    let left = state.left_decimal();
    let currency = receipt.amount.currency();
    let mut problem = Problem::new(
        Code::RefundExceedsCharge,
        match asked {
            Some(asked) => format!(
                "refunding {asked} would pass what order {} was charged ({}): {left} {currency} is left to refund; nothing was refunded",
                receipt.order_id, receipt.amount
            ),
            None => format!(
                "order {} is refunded in full ({}): 0 {currency} is left to refund; nothing was refunded",
                receipt.order_id, receipt.amount
            ),
        },
    );
    problem.body.refund_left = Some(left);
    problem
}

/// Runs one refund to its answer. Everything retried happens inside `assistant`.
pub(crate) async fn run(
    app: &AppState,
    request: RefundRequest,
    operation_key: OperationKey,
    caller: &Caller,
    fence: Option<i64>,
) -> HttpAnswer {
    let RefundRequest {
        order,
        reason,
        email,
        format,
        needs_approval,
        ..
    } = request;
    let mut ctx =
        OperationContext::new(order, email, operation_key, &caller.name, fence).refunding(reason);
    if needs_approval {
        ctx = ctx.needing_approval();
    }
    let result = app.assistant().run(ctx.clone()).await;
    if let Err(err) = &result
        && let Some(found) = err.kind.approval()
    {
        let found = found.cloned();
        return Box::pin(paused::pause(app, &ctx, found)).await;
    }
    Box::pin(outcome::answer(app, &ctx, result, format)).await
}
