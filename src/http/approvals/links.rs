//! An approval's links (`approveUrl`, `denyUrl` of `approval.requested`): `GET` shows a
//! page and changes nothing (mail scanners and chat previews fetch links); `POST`, the
//! page's button, decides through `decide`, the one decision of every channel, as the
//! caller `link` (the decision is recorded as made through the link). The token is the
//! capability: no API key is asked for, and only its hash is stored; the request's span
//! names the route's template, never the token.

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::{decide, unavailable};
use crate::approvals::{Approval, LinkDecision};
use crate::caller::{Caller, Scope, Scopes};
use crate::http::error::{Code, Problem, ProblemBody};
use crate::http::state::AppState;

/// Who decides through a link.
const LINK_CALLER: &str = "link";

fn no_such_link() -> Response {
    Problem::new(
        Code::NotFound,
        "there is no approval link with this token (a link is used whole, as it was sent)",
    )
    .into_response()
}

#[utoipa::path(
    get,
    path = "/approvals/links/{token}",
    operation_id = "showApprovalLink",
    tag = "approvals",
    summary = "An approval link's page: what it decides, and its button",
    description = "No API key: the token is the capability. Changes nothing, however often it is fetched. 404 for a token no pause made.",
    params(("token" = String, Path, description = "The link's token, as approval.requested sent it")),
    responses(
        (status = 200, description = "The page (text/html)", content_type = "text/html", body = String),
        (status = 404, description = "`not_found`: no such link", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub async fn show(State(app): State<AppState>, Path(token): Path<String>) -> Response {
    let (id, decision) = match app.approvals().by_link(&token).await {
        Ok(Some(found)) => found,
        Ok(None) => return no_such_link(),
        Err(err) => return unavailable(err),
    };
    match app.approvals().get(id).await {
        Ok(Some(approval)) => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            page(&approval, decision),
        )
            .into_response(),
        Ok(None) => no_such_link(),
        Err(err) => unavailable(err),
    }
}

#[utoipa::path(
    post,
    path = "/approvals/links/{token}",
    operation_id = "decideByApprovalLink",
    tag = "approvals",
    summary = "Decide through an approval link",
    description = "No API key: the token is the capability. The approve link answers as POST /approvals/{id}/approve, the deny link as POST /approvals/{id}/deny: the first decision of any channel wins; the same link again answers as the first time; the other link is 409 `approval_decided`. 404 for a token no pause made.",
    params(("token" = String, Path, description = "The link's token, as approval.requested sent it")),
    responses(
        (status = 200, description = "The decision's answer, as the approvals endpoints give it"),
        (status = 404, description = "`not_found`: no such link", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`approval_decided`: decided the other way already", body = ProblemBody, content_type = "application/problem+json"),
        (status = 410, description = "`approval_expired`", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub async fn decide_by_link(State(app): State<AppState>, Path(token): Path<String>) -> Response {
    let (id, decision) = match app.approvals().by_link(&token).await {
        Ok(Some(found)) => found,
        Ok(None) => return no_such_link(),
        Err(err) => return unavailable(err),
    };
    let caller = Caller {
        name: LINK_CALLER.to_owned(),
        scopes: Scopes::of(&[Scope::Approve]),
        approval_above: None,
        budget_per_day: None,
    };
    match decision {
        LinkDecision::Approve => Box::pin(decide::approve(&app, &caller, id)).await,
        LinkDecision::Deny => decide::deny(&app, &caller, id, None).await,
    }
}

/// The page: what the link decides, and one button that POSTs to the same URL. Plain
/// HTML, no script.
fn page(a: &Approval, decision: LinkDecision) -> String {
    let (verb, button) = match decision {
        LinkDecision::Approve => ("approve", "Approve"),
        LinkDecision::Deny => ("deny", "Deny"),
    };
    let pending = a.status == crate::approvals::Status::Pending;
    let form = if pending {
        format!(r#"<form method="post"><button type="submit">{button}</button></form>"#)
    } else {
        format!("<p>This approval is {} already.</p>", a.status)
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{button} the {kind} of {amount} for order {order}</title></head>\n<body>\n<h1>{button} the {kind} of {amount} for order {order}?</h1>\n<dl><dt>Order</dt><dd>{order}</dd><dt>Amount</dt><dd>{amount}</dd><dt>Caller</dt><dd>{caller}</dd><dt>Expires</dt><dd>{expires}</dd><dt>Status</dt><dd>{status}</dd></dl>\n<p>Pressing the button will {verb} it; opening this page changes nothing.</p>\n{form}\n</body></html>\n",
        kind = a.kind,
        amount = escape(&a.amount.to_string()),
        order = escape(&a.order_id),
        caller = escape(&a.caller),
        expires = a
            .expires_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        status = a.status,
    )
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
