//! The error answers of the approvals endpoints, for the API document.

use std::collections::BTreeMap;

use utoipa::IntoResponses;
use utoipa::openapi::{RefOr, Response as DocResponse};

use crate::caller::AuthRefusal;
use crate::http::error::{Code, Problem, documented};

/// The error answers of the approvals endpoints.
pub struct ApprovalErrors;

impl IntoResponses for ApprovalErrors {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        let id = "0193a8f0-5f2c-7cc1-9d7e-3c1a2b4d5e6f";
        documented([
            (
                "`invalid_request`: not an approval id, a bad `limit` or `status`, a body that is not `{\"reason\"}`",
                vec![Problem::invalid("id", "\"x\" is not an approval id (a UUID)")],
            ),
            (
                "`unauthorized`: no valid API key (see WWW-Authenticate)",
                vec![Problem::unauthorized(AuthRefusal::Missing)],
            ),
            (
                "`forbidden`: deciding needs the scope `approve`",
                vec![Problem::new(
                    Code::Forbidden,
                    "deciding approvals needs an API key with the scope approve",
                )],
            ),
            (
                "`not_found`: no such approval (or another caller's, without the scope `approve`)",
                vec![Problem::new(Code::NotFound, format!("there is no approval {id}"))],
            ),
            (
                "`approval_decided`: decided the other way already; `in_flight`: approved, its checkout still running",
                vec![
                    Problem::new(
                        Code::ApprovalDecided,
                        format!("approval {id} was denied by \"ops\" already; the first decision stands"),
                    ),
                    Problem::new(
                        Code::InFlight,
                        format!("approval {id} is approved and its checkout is running; repeat this request for its answer"),
                    )
                    .retry_after(1),
                ],
            ),
            (
                "`approval_expired`: nobody decided it in time; nothing was charged",
                vec![Problem::new(
                    Code::ApprovalExpired,
                    format!("nobody decided approval {id} of the charge of 500.00 USD for order A-100 before it expired; nothing was charged"),
                )],
            ),
            (
                "`unavailable`: the database could not be reached; `overloaded`: the instance runs as many checkouts as it takes",
                vec![
                    Problem::unavailable("cannot read the approvals: pool timed out while waiting for an open connection"),
                    Problem::new(
                        Code::Overloaded,
                        "this instance is running as many checkouts as it takes; retry shortly",
                    )
                    .retry_after(1),
                ],
            ),
        ])
    }
}
