//! What a model request can come to when it fails: [`ModelErrorKind`], and
//! [`ModelError`], the kind with the retries it took.
use std::time::Duration;

use tower::BoxError;

pub use crate::retry::Stop;
use crate::retry::{Retried, Unit};

/// One chat-completions round that failed, after the request retry had its say.
pub type ModelError = Retried<ModelErrorKind>;

#[derive(Debug, thiserror::Error)]
pub enum ModelErrorKind {
    #[error("cannot connect to the model provider: {}", causes(.0.as_ref()))]
    Connect(#[source] BoxError),
    #[error("the model provider did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    #[error("the connection to the model provider failed: {}", causes(.0.as_ref()))]
    Transport(#[source] BoxError),
    #[error("the model provider answered {status}{}: {message}", code.as_ref().map(|c| format!(" {c}")).unwrap_or_default())]
    Status {
        status: u16,
        code: Option<String>,
        message: String,
        retry_after: Option<Duration>,
    },
    /// An answer that cannot be used, and that a repeat on the same endpoint would get
    /// again: not a chat completion, over the size bound, a head that is not valid HTTP,
    /// an encoding not asked for, a redirect. Not repeated here; the next endpoint, if
    /// any, is asked once.
    #[error("the model provider's answer cannot be used: {0}")]
    Unusable(String),
    /// Not sent: the endpoint's circuit breaker is open.
    #[error("the model endpoint's circuit breaker is open: no request was sent to it")]
    CircuitOpen,
}

impl ModelErrorKind {
    /// The failures the request retry repeats: connect errors, timeouts, broken
    /// connections, 408, 429 (unless the quota is spent), 500, 502, 503, 504.
    pub fn is_retryable(&self) -> bool {
        match self {
            ModelErrorKind::Connect(_)
            | ModelErrorKind::Timeout(_)
            | ModelErrorKind::Transport(_) => true,
            ModelErrorKind::Status { status, code, .. } => match status {
                408 | 500 | 502 | 503 | 504 => true,
                429 => code.as_deref() != Some("insufficient_quota"),
                _ => false,
            },
            ModelErrorKind::Unusable(_) | ModelErrorKind::CircuitOpen => false,
        }
    }

    /// A 4xx from the provider: the request itself was refused (bad key, bad request,
    /// spent quota). Repeating the loop would only repeat the refusal.
    pub fn is_refusal(&self) -> bool {
        matches!(self, ModelErrorKind::Status { status, .. } if (400..500).contains(status) && !self.is_retryable())
    }

    pub fn upstream_status(&self) -> Option<u16> {
        match self {
            ModelErrorKind::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// A short stable name of the failure, for metrics labels (`error.type` in the GenAI
    /// conventions): `connect`, `timeout`, `transport`, `http_<status>`, `unusable`.
    pub fn reason(&self) -> &'static str {
        match self {
            ModelErrorKind::Connect(_) => "connect",
            ModelErrorKind::Timeout(_) => "timeout",
            ModelErrorKind::Transport(_) => "transport",
            ModelErrorKind::Status { status, .. } => match status {
                400 => "http_400",
                401 => "http_401",
                403 => "http_403",
                404 => "http_404",
                408 => "http_408",
                422 => "http_422",
                429 => "http_429",
                500 => "http_500",
                502 => "http_502",
                503 => "http_503",
                504 => "http_504",
                400..500 => "http_4xx",
                500..600 => "http_5xx",
                _ => "http_other",
            },
            ModelErrorKind::Unusable(_) => "unusable",
            ModelErrorKind::CircuitOpen => "circuit_open",
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ModelErrorKind::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl ModelError {
    /// No connection could be made (refused, unreachable, a failed handshake).
    pub fn connect(err: impl Into<BoxError>) -> Self {
        ModelError::new(ModelErrorKind::Connect(err.into()))
    }

    /// An answer that cannot be used, for `why`.
    pub fn unusable(why: String) -> Self {
        ModelError::new(ModelErrorKind::Unusable(why))
    }

    /// The connection failed under a request.
    pub fn transport(err: impl Into<BoxError>) -> Self {
        ModelError::new(ModelErrorKind::Transport(err.into()))
    }

    /// Whether the next endpoint may answer this turn: this one failed transiently (its
    /// request retry gave up, or left it to the next), its breaker is open, its answer
    /// cannot be used (once: the next's may), or the conversation is too long for it (the next may have the room). Never a refusal
    /// that is ours (a bad key, a bad request, a content policy).
    pub fn fails_over(&self) -> bool {
        match &self.kind {
            ModelErrorKind::CircuitOpen | ModelErrorKind::Unusable(_) => true,
            ModelErrorKind::Status {
                status: 400, code, ..
            } => code.as_deref() == Some("context_length_exceeded"),
            kind => kind.is_retryable() && self.stop.is_some_and(|s| s != Stop::NotRetryable),
        }
    }
}

impl Unit for ModelErrorKind {
    const LAYER: &'static str = "request retry";
    const TRY: &'static str = "request";

    fn timed_out(after: Duration) -> Self {
        ModelErrorKind::Timeout(after)
    }

    fn foreign(err: &BoxError) -> Self {
        ModelErrorKind::Unusable(err.to_string())
    }
}

/// An error and its causes, as one line: hyper's own message (`client error (Connect)`)
/// says little without the cause under it (`Connection refused`).
fn causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(err) = cause {
        let said = err.to_string();
        if !line.ends_with(&said) {
            line.push_str(": ");
            line.push_str(&said);
        }
        cause = err.source();
    }
    line
}
