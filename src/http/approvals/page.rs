//! The approval links' HTML, for a person's browser: plain HTML, no script, one form.
//! The link page (`GET`) shows the approval as it stands (with the receipt once an
//! approved operation has its answer); the decision page answers the form's `POST` with
//! what was decided and, for an approval, the resumed operation's result. While the
//! approved operation is still running, either page reloads the link page by
//! `<meta http-equiv="refresh">` (and links to it), which changes nothing.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::approvals::{Approval, LinkDecision, Status};
use crate::idempotency::Saved;

/// Seconds before a page whose operation is still running reloads the link page.
const REFRESH_SECS: u32 = 2;

/// Whether the request asks for HTML over JSON (`Accept`): a browser's form submit and
/// navigation send `text/html` first; an API client sends JSON, `*/*` or nothing, and
/// keeps the JSON answer. The `Accept` header rather than the form's content type, since
/// it is what a client says it reads, as `Accept: text/plain` does on `POST /checkout`.
pub(super) fn wants_html(headers: &HeaderMap) -> bool {
    let (mut html, mut json) = (0.0_f32, 0.0_f32);
    for (media, q) in crate::http::extract::accept_ranges(headers) {
        match media.as_str() {
            "text/html" | "application/xhtml+xml" => html = html.max(q),
            "application/json" | "application/problem+json" | "application/*" => {
                json = json.max(q);
            }
            _ => {}
        }
    }
    html > 0.0 && html >= json
}

/// What an approved operation's record holds, for the link page.
pub(super) enum Outcome {
    /// Not approved, or its record is gone.
    Nothing,
    /// Approved, and its operation still running.
    Running,
    /// Approved, and its operation's answer (status, JSON body).
    Answered(u16, Value),
}

impl Outcome {
    pub(super) fn of(saved: Saved) -> Outcome {
        Outcome::Answered(
            saved.status,
            serde_json::from_slice(&saved.body).unwrap_or(Value::Null),
        )
    }
}

/// The link page: the approval, its state, and the button while it is pending.
pub(super) fn link_page(
    a: &Approval,
    token: &str,
    decision: LinkDecision,
    outcome: &Outcome,
) -> Response {
    let button = button(decision);
    let state = match (a.status, outcome) {
        (Status::Pending, _) => format!(
            "<p>Pressing the button will {verb} it; opening this page changes nothing.</p>\n<form method=\"post\"><button type=\"submit\">{button}</button></form>",
            verb = button.to_ascii_lowercase()
        ),
        (Status::Approved, Outcome::Answered(status, body)) => {
            format!(
                "<p>This approval is approved.</p>\n{}",
                result(*status, body)
            )
        }
        (Status::Approved, Outcome::Running) => format!(
            "<p>This approval is approved; its {kind} is still running.</p>\n{}",
            reload(token),
            kind = a.kind
        ),
        (status, _) => format!("<p>This approval is {status}.</p>"),
    };
    let refresh = matches!((a.status, outcome), (Status::Approved, Outcome::Running));
    let refresh = refresh.then_some(token);
    html(
        StatusCode::OK,
        &format!(
            "{button} the {} of {} for order {}",
            a.kind,
            a.amount,
            escape(&a.order_id)
        ),
        refresh,
        &format!("{}\n{state}", facts(a)),
    )
}

/// The decision page: the answer `decided` (as the approvals endpoints give it, JSON or
/// a problem) shown as HTML, with its status.
pub(super) async fn decision_page(
    token: &str,
    decision: LinkDecision,
    decided: Response,
) -> Response {
    let status = decided.status();
    let body = axum::body::to_bytes(decided.into_body(), 1 << 20)
        .await
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .unwrap_or(Value::Null);
    let code = body["code"].as_str().unwrap_or_default();
    let (title, text, refresh) = match (decision, status.is_success(), code) {
        (LinkDecision::Approve, true, _) => (
            "Approved",
            format!("<p>Approved.</p>\n{}", result(status.as_u16(), &body)),
            None,
        ),
        (LinkDecision::Deny, true, _) => (
            "Denied",
            "<p>Denied. Nothing is charged or refunded.</p>".to_owned(),
            None,
        ),
        (LinkDecision::Approve, false, "in_flight") => (
            "Approved",
            format!(
                "<p>Approved; its operation is still running.</p>\n{}",
                reload(token)
            ),
            Some(token),
        ),
        (_, false, _) => (
            body["title"].as_str().unwrap_or("Refused"),
            format!(
                "<p>{}</p>\n<p><a href=\"{}\">See the approval as it stands</a>.</p>",
                escape(body["detail"].as_str().unwrap_or_default()),
                escape(token),
            ),
            None,
        ),
    };
    html(status, &escape(title), refresh, &text)
}

/// The approval's facts, as a definition list.
fn facts(a: &Approval) -> String {
    format!(
        "<dl><dt>Order</dt><dd>{order}</dd><dt>Amount</dt><dd>{amount}</dd><dt>Caller</dt><dd>{caller}</dd><dt>Expires</dt><dd>{expires}</dd><dt>Status</dt><dd id=\"status\">{status}</dd></dl>",
        order = escape(&a.order_id),
        amount = escape(&a.amount.to_string()),
        caller = escape(&a.caller),
        expires = a
            .expires_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        status = a.status,
    )
}

/// An approved operation's answer: its receipt (and refund) when it succeeded, its
/// problem when it failed.
fn result(status: u16, body: &Value) -> String {
    let receipt = &body["receipt"];
    if (200..300).contains(&status) && receipt.is_object() {
        let refund = match body["refund"]["amount"].as_str() {
            Some(amount) => format!("<dt>Refunded</dt><dd>{}</dd>", escape(amount)),
            None => String::new(),
        };
        let field = |name: &str| escape(receipt[name].as_str().unwrap_or_default());
        format!(
            "<h2>Receipt</h2>\n<dl id=\"receipt\"><dt>Order</dt><dd>{}</dd><dt>Amount</dt><dd>{} {}</dd><dt>Receipt</dt><dd id=\"receipt-id\">{}</dd>{refund}</dl>",
            field("orderId"),
            field("amount"),
            field("currency"),
            field("id"),
        )
    } else {
        format!(
            "<p>It did not go through ({status}): {}</p>",
            escape(body["detail"].as_str().unwrap_or_default())
        )
    }
}

/// The link to the link page: its token, relative to the page's own URL (the same URL,
/// fetched with `GET`, which changes nothing).
fn reload(token: &str) -> String {
    format!(
        "<p>This page shows the result within {REFRESH_SECS} s; or <a href=\"{}\">see the approval as it stands</a>.</p>",
        escape(token)
    )
}

fn button(decision: LinkDecision) -> &'static str {
    match decision {
        LinkDecision::Approve => "Approve",
        LinkDecision::Deny => "Deny",
    }
}

/// A page; with `refresh`, one that loads the link of that token after a while.
fn html(status: StatusCode, title: &str, refresh: Option<&str>, body: &str) -> Response {
    let refresh = match refresh {
        Some(token) => format!(
            "<meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}; url={}\">",
            escape(token)
        ),
        None => String::new(),
    };
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        format!(
            "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{refresh}<title>{title}</title></head>\n<body>\n<h1>{title}</h1>\n{body}\n</body></html>\n"
        ),
    )
        .into_response()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, value.parse().unwrap());
        headers
    }

    // Seen failing: with `html > 0.0 &&` dropped, a client without Accept got HTML.
    #[test]
    fn a_browser_gets_html_and_an_api_client_json() {
        let chromium = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7";
        assert!(wants_html(&accept(chromium)));
        assert!(!wants_html(&HeaderMap::new()));
        assert!(!wants_html(&accept("*/*")));
        assert!(!wants_html(&accept("application/json")));
        assert!(!wants_html(&accept("application/json, text/html;q=0.5")));
        assert!(!wants_html(&accept("text/html;q=0")));
    }
}
