//! A finished answer: the one value every handler's outcome becomes, sent to the client
//! and saved under an Idempotency-Key.

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::journal::NewEntry;

/// A finished answer: what is sent, and what an idempotency record saves for replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpAnswer {
    pub status: StatusCode,
    pub content_type: String,
    pub body: Bytes,
    pub retry_after: Option<u64>,
    /// Where the answer's resource is (a paused checkout's approval).
    pub location: Option<String>,
    /// The answer is in the operation's record already, written with what it reports (a
    /// pause): whoever runs the operation does not save it again.
    pub saved: bool,
    /// A final outcome, saved under an Idempotency-Key and replayed: the same request
    /// would end the same way. Transient failures are not: a retry may well succeed.
    pub final_outcome: bool,
    /// The operation's last journal steps (its closing answer), committed with the saved
    /// answer: one commit where there were two.
    pub closing: Vec<NewEntry>,
}

impl HttpAnswer {
    pub fn new(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Self {
        HttpAnswer {
            status,
            content_type: content_type.to_owned(),
            body: body.into(),
            retry_after: None,
            location: None,
            saved: false,
            final_outcome: status.is_success(),
            closing: Vec::new(),
        }
    }

    pub fn json(status: StatusCode, body: &impl Serialize) -> Self {
        // A checkout's answer is some 600 bytes: one allocation, not one per doubling.
        let mut json = Vec::with_capacity(1024);
        serde_json::to_writer(&mut json, body).expect("answers always serialize");
        HttpAnswer::new(status, "application/json", json)
    }
}

impl IntoResponse for HttpAnswer {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        if let Ok(value) = HeaderValue::from_str(&self.content_type) {
            headers.insert(header::CONTENT_TYPE, value);
        }
        if let Some(location) = self.location.and_then(|l| HeaderValue::from_str(&l).ok()) {
            headers.insert(header::LOCATION, location);
        }
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
