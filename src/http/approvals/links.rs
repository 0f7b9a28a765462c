//! An approval's links (`approveUrl`, `denyUrl` of `approval.requested`): `GET` shows a
//! page and changes nothing (mail scanners and chat previews fetch links); `POST`, the
//! page's button, decides through `decide`, the one decision of every channel, as the
//! caller `link` (the decision is recorded as made through the link); a browser's submit
//! (`Accept: text/html`) gets the answer as a page (`page`), an API client as JSON. The
//! token is the
//! capability: no API key is asked for, and only its hash is stored; the request's span
//! names the route's template, never the token.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::page::{self, Outcome};
use super::{decide, unavailable};
use crate::approvals::{LinkDecision, Status};
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
    let approval = match app.approvals().get(id).await {
        Ok(Some(approval)) => approval,
        Ok(None) => return no_such_link(),
        Err(err) => return unavailable(err),
    };
    let outcome = if approval.status == Status::Approved {
        match app
            .records()
            .status(&approval.caller, &approval.operation_key)
            .await
        {
            Ok(Some(Ok(saved))) => Outcome::of(saved),
            Ok(Some(Err(_))) => Outcome::Running,
            Ok(None) => Outcome::Nothing,
            Err(err) => return unavailable(err),
        }
    } else {
        Outcome::Nothing
    };
    page::link_page(&approval, &token, decision, &outcome)
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
        (status = 200, description = "The decision's answer, as the approvals endpoints give it; with `Accept: text/html` (a browser's form submit), a page saying what was decided and, for an approval, the receipt (or that it is being made, reloading the link's page)"),
        (status = 404, description = "`not_found`: no such link", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`approval_decided`: decided the other way already", body = ProblemBody, content_type = "application/problem+json"),
        (status = 410, description = "`approval_expired`", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub async fn decide_by_link(
    State(app): State<AppState>,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Response {
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
    let decided = match decision {
        LinkDecision::Approve => Box::pin(decide::approve(&app, &caller, id)).await,
        LinkDecision::Deny => decide::deny(&app, &caller, id, None).await,
    };
    if page::wants_html(&headers) {
        page::decision_page(&token, decision, decided).await
    } else {
        decided
    }
}
