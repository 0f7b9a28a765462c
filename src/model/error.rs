use std::fmt;
use std::time::Duration;

/// One chat-completions round that failed, after the request retry had its say.
#[derive(Debug)]
pub struct ModelError {
    pub kind: ModelErrorKind,
    /// HTTP requests sent for this round, retries included.
    pub attempts: u32,
    /// Why the request retry stopped (unset until the request retry has seen the error).
    pub stop: Option<Stop>,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelErrorKind {
    #[error("cannot connect to the model provider: {0}")]
    Connect(#[source] reqwest::Error),
    #[error("the model provider did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    #[error("the connection to the model provider failed: {0}")]
    Transport(#[source] reqwest::Error),
    #[error("the model provider answered {status}{}: {message}", code.as_ref().map(|c| format!(" {c}")).unwrap_or_default())]
    Status {
        status: u16,
        code: Option<String>,
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("the model provider's answer is not a chat completion: {0}")]
    Malformed(String),
}

/// Why the request retry stopped retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The failure is not one a repeat can mend (a 4xx such as a bad API key).
    NotRetryable,
    /// Every allowed retry was used.
    RetriesSpent,
    /// The retry budget shared by all requests is empty: the provider is failing broadly.
    BudgetSpent,
    /// The provider asked to wait longer than we are allowed to.
    RetryAfterTooLong(Duration),
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
            ModelErrorKind::Malformed(_) => false,
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

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ModelErrorKind::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl ModelError {
    pub fn new(kind: ModelErrorKind) -> Self {
        ModelError {
            kind,
            attempts: 1,
            stop: None,
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        let attempts = self.attempts;
        let plural = if attempts == 1 { "" } else { "s" };
        match self.stop {
            None => Ok(()),
            Some(Stop::NotRetryable) => write!(
                f,
                "; the request retry does not repeat this failure ({attempts} request{plural})"
            ),
            Some(Stop::RetriesSpent) => {
                write!(
                    f,
                    "; the request retry gave up after {attempts} request{plural}"
                )
            }
            Some(Stop::BudgetSpent) => write!(
                f,
                "; the request retry gave up after {attempts} request{plural}: the retry budget is spent"
            ),
            Some(Stop::RetryAfterTooLong(wait)) => write!(
                f,
                "; the request retry gave up after {attempts} request{plural}: Retry-After asked for {} ms, beyond the cap",
                wait.as_millis()
            ),
        }
    }
}

impl std::error::Error for ModelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.kind)
    }
}
