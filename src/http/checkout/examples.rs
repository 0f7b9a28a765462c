//! The error answers of `POST /checkout` in the API document, each status with an
//! example of each code.

use std::collections::BTreeMap;

use utoipa::IntoResponses;
use utoipa::openapi::{RefOr, Response as DocResponse};

use crate::caller::{AuthRefusal, Scope};
use crate::http::auth::forbidden;
use crate::http::error::{Code, Problem, documented};

/// The error answers of `POST /checkout`, each status with an example of each code.
pub struct CheckoutErrors;

impl IntoResponses for CheckoutErrors {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        let receipt = "0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f";
        let failed = |code, detail: &str, charged: bool| {
            let mut problem = Problem::new(code, detail);
            problem.body.attempts = Some(1);
            problem.body.order_charged = Some(Some(charged));
            problem.body.charged = Some(Some(charged));
            if charged {
                problem.body.receipt_id = Some(receipt.to_owned());
            }
            problem
        };
        let mut conflict = Problem::new(
            Code::AmountConflict,
            "order A-100 was already charged 42.50 USD, not 43.00 USD; nothing was charged",
        );
        conflict.body.order_charged = Some(Some(true));
        conflict.body.charged = Some(Some(false));
        conflict.body.receipt_id = Some(receipt.to_owned());
        conflict.body.charged_amount = Some("42.50".to_owned());
        conflict.body.charged_currency = Some("USD".to_owned());
        let mut model_error = failed(
            Code::ModelError,
            "the model provider answered 503 server_error: overloaded; the request retry gave up after 3 requests; the loop retry gave up after 3 loop attempts; the order was not charged",
            false,
        );
        model_error.body.attempts = Some(3);
        model_error.body.request_attempts = Some(3);
        model_error.body.upstream_status = Some(503);
        model_error.body.layer = Some("loop retry".to_owned());
        let mut unavailable = failed(
            Code::Unavailable,
            "the database did not answer: pool timed out while waiting for an open connection; the loop retry gave up after 3 loop attempts; whether order A-100 was charged is unknown until the database answers (GET /receipts/A-100)",
            false,
        );
        unavailable.body.attempts = Some(3);
        unavailable.body.layer = Some("loop retry".to_owned());
        unavailable.body.order_charged = Some(None);
        unavailable.body.charged = Some(None);
        let mut deadline = failed(
            Code::DeadlineExceeded,
            "the model provider did not answer within 10000 ms; the request retry gave up after 3 requests; the loop retry is off; order A-100 is charged (receipt 0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f)",
            true,
        );
        deadline.body.request_attempts = Some(3);
        deadline.body.layer = Some("request retry".to_owned());
        let mut declined = Problem::new(
            Code::PaymentDeclined,
            "the payment provider declined the payment (generic_decline): Your card was declined.; the loop retry does not repeat this failure (1 loop attempt); the order was not charged; a new checkout of it makes a new attempt",
        );
        declined.body.decline_code = Some("generic_decline".to_owned());
        declined.body.payment_id = Some("pi_3MtwBwLkdIwHu7ix28a3tqPa".to_owned());
        declined.body.attempts = Some(1);
        declined.body.order_charged = Some(Some(false));
        declined.body.charged = Some(Some(false));
        let mut requires_action = Problem::new(
            Code::PaymentRequiresAction,
            "the payment needs the customer's action at the payment provider (3-D Secure), payment pi_3MtwBwLkdIwHu7ix28a3tqPa; completing it is out of scope; the loop retry does not repeat this failure (1 loop attempt); the order was not charged",
        );
        requires_action.body.payment_id = Some("pi_3MtwBwLkdIwHu7ix28a3tqPa".to_owned());
        requires_action.body.attempts = Some(1);
        requires_action.body.order_charged = Some(Some(false));
        requires_action.body.charged = Some(Some(false));
        let mut provider_error = failed(
            Code::ProviderError,
            "the payment provider gave no outcome: the payment provider answered 503 : overloaded; no payment of attempt 1 is found by its metadata yet; the loop retry gave up after 3 loop attempts; whether the payment provider charged order A-100 is unknown: its payment intent stays open, and the next run of this checkout (a retry with the same Idempotency-Key, another checkout of the order, the recovery sweep) settles it under the same key, never charging it twice",
            false,
        );
        provider_error.body.attempts = Some(3);
        provider_error.body.layer = Some("loop retry".to_owned());
        provider_error.body.order_charged = Some(None);
        provider_error.body.charged = Some(None);
        let mut over_budget = Problem::new(
            Code::BudgetExceeded,
            "charging 42.50 USD for order A-100 would pass this caller's budget for today (UTC): 20.00 USD of 100.00 USD is left; nothing was charged",
        );
        over_budget.body.attempts = Some(1);
        over_budget.body.order_charged = Some(Some(false));
        over_budget.body.charged = Some(Some(false));
        over_budget.body.budget_left = Some("20.00".to_owned());
        documented([
            (
                "Invalid input (`invalid_request`, with `field`); nothing was charged",
                vec![Problem::invalid(
                    "amount",
                    "amount 1.234 has more than 2 digit(s) after the decimal point, the most USD allows",
                )],
            ),
            (
                "`content_too_large`: the body is over the limit (CHECKOUT_BODY_LIMIT_BYTES, 16384 bytes by default); nothing was run or recorded",
                vec![Problem::new(
                    Code::ContentTooLarge,
                    "the request body is larger than this service takes (CHECKOUT_BODY_LIMIT_BYTES); nothing was run or recorded",
                )],
            ),
            (
                "`unauthorized`: no valid API key (see WWW-Authenticate); nothing was charged",
                vec![Problem::unauthorized(AuthRefusal::Missing)],
            ),
            (
                "`forbidden`: the API key lacks the scope `checkout`; `budget_exceeded`: the charge would pass the caller's budget for the UTC day (CHECKOUT_BUDGET_PER_DAY, or the key's own), with what is left in `budgetLeft`. Nothing was charged",
                vec![forbidden(Scope::Checkout), over_budget],
            ),
            (
                "`payment_declined`: the payment provider declined the payment (with its `declineCode`); `payment_requires_action`: the provider waits for the customer (3-D Secure, not completed by this service). Nothing was charged",
                vec![declined, requires_action],
            ),
            (
                "`amount_conflict`: the order was charged another amount; or `in_flight`: the same Idempotency-Key is still running (see Retry-After)",
                vec![
                    conflict,
                    Problem::new(
                        Code::InFlight,
                        "a request with Idempotency-Key \"order-A-100\" is still being processed; retry after it finishes",
                    ),
                ],
            ),
            (
                "`key_reuse`: the Idempotency-Key was used with another order or amount",
                vec![Problem::new(
                    Code::KeyReuse,
                    "Idempotency-Key \"order-A-100\" was first used for another request (another order, amount or currency); a new request needs a new key",
                )],
            ),
            (
                "`model_error`: the model provider failed after retries; `model_did_not_charge`: the model finished without charging; `provider_error`: the payment provider gave no outcome or refused the request",
                vec![
                    provider_error,
                    model_error,
                    failed(
                        Code::ModelDidNotCharge,
                        "the model finished without charging the order; the loop retry does not repeat this failure (1 loop attempt); the order was not charged",
                        false,
                    ),
                ],
            ),
            (
                "`rate_limited`: this caller sent more checkouts than its rate limit (CHECKOUT_RATE_LIMIT_PER_SEC, per instance); nothing was run or recorded. See Retry-After, and the IETF fields RateLimit-Policy (`\"checkout\";q=<burst>;w=<seconds>`) and RateLimit (`\"checkout\";r=<remaining>;t=<seconds until whole>`), which every answer of this route carries while a rate limit is set",
                vec![Problem::new(
                    Code::RateLimited,
                    "this caller sent more checkouts than its limit of 5 per second (burst 10) on this instance; nothing was run or recorded; send again after 1 s",
                )],
            ),
            (
                "`unavailable`: the database could not be reached; `overloaded`: the instance runs as many checkouts as it takes at once (CHECKOUT_MAX_IN_FLIGHT) and refused this one before anything was run or recorded, so the same request, with the same Idempotency-Key, can be sent again. Both with Retry-After",
                vec![
                    unavailable,
                    Problem::new(
                        Code::Overloaded,
                        "this instance is running its limit of 10000 checkouts at once (CHECKOUT_MAX_IN_FLIGHT); nothing was run or recorded, so the same request (with the same Idempotency-Key) can be sent again after 4 s",
                    ),
                ],
            ),
            (
                "`deadline_exceeded`: the checkout timed out after retries",
                vec![deadline],
            ),
            (
                "`journal_mismatch`: the operation's journal does not match its replay (never replayed silently); nothing further was run",
                vec![Problem::new(
                    Code::JournalMismatch,
                    "the operation's journal does not match its replay at step 2: the journal has the result of tool \"refund\" (call call_1_1), the replayed answer calls \"charge\" (call call_1_1)",
                )],
            ),
        ])
    }
}
