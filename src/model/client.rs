//! The chat-completions client, one per model endpoint, as a tower stack (outermost
//! first): request retry ─► circuit breaker ─► observe (span, metrics) ─► request timeout
//! ─► the POST (`transport/`). This is the one description of the stack; the README and
//! docs/models.md point here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use hyper::Request;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

use super::breaker::{Breaker, BreakerLayer, BreakerSettings};
use super::call::ModelCall;
use super::error::{ModelError, ModelErrorKind};
use super::live::LiveText;
use super::observe::ObserveLayer;
use super::reasoning::{self, ReasoningEffort};
use super::responses::{self, WireApi};
use super::responses_stream;
use super::retry::{RequestRetry, RequestRetrySettings};
use super::stream;
use super::transport::{Transport, TransportSettings};
use super::wire::{AssistantMessage, ChatRequest, ChatResponse, MAX_TOOL_CALLS, TokenUsage};
use crate::metrics::Metrics;
use crate::secret::Secret;
use crate::telemetry::genai;

/// Where the model is and how to reach it.
#[derive(Clone, Debug)]
pub struct ModelEndpoint {
    /// Base URL, such as `https://api.openai.com/v1`; `/chat/completions` (or `/responses`)
    /// is appended.
    pub base_url: String,
    pub api_key: Option<Secret>,
    pub model: String,
    /// Speak HTTP/2 without TLS (prior knowledge) to an `http://` base URL: many requests
    /// share a few connections instead of holding one each. Over `https://` the client
    /// offers HTTP/2 by ALPN whatever this says.
    pub h2c: bool,
    /// Sent as `reasoning_effort` when set (`OPENAI_REASONING_EFFORT`).
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Chat completions or the Responses API (`OPENAI_WIRE_API`).
    pub wire: WireApi,
}

impl ModelEndpoint {
    /// How the log, `/health/ready` and the journal name the endpoint (the metrics name
    /// it by its model and position: [`ModelClient::metric_label`]).
    pub fn name(&self) -> String {
        format!("{}@{}", self.model, self.base_url)
    }
}

#[derive(Clone)]
pub struct ModelClient {
    stack: BoxCloneSyncService<ModelCall, ChatResponse, BoxError>,
    model: Arc<str>,
    reasoning_effort: Option<ReasoningEffort>,
    wire: WireApi,
    /// The forward proxy its requests go through, if the environment names one.
    proxy: Option<Arc<str>>,
    /// `model@base_url`: [`ModelEndpoint::name`].
    name: Arc<str>,
    /// `model#position`: the metrics' name, without the URL (an address is never a label).
    metric_label: Arc<str>,
    breaker: Breaker,
    metrics: Metrics,
}

/// How every endpoint's requests are made: retried, timed, broken, carried.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    pub retry: RequestRetrySettings,
    pub breaker: BreakerSettings,
    pub transport: TransportSettings,
}

impl ModelClient {
    /// `position`: 1 for the primary, 2 for the first fallback, …
    pub fn new(
        endpoint: &ModelEndpoint,
        position: usize,
        settings: &ClientSettings,
        metrics: &Metrics,
    ) -> Result<Self, BoxError> {
        let url = format!(
            "{}{}",
            endpoint.base_url.trim_end_matches('/'),
            endpoint.wire.path()
        );
        let transport = Transport::new(url.parse()?, endpoint.h2c, &settings.transport)?;
        let proxy = transport.proxy().map(Arc::from);
        let authorization = match &endpoint.api_key {
            Some(key) => {
                let mut value = HeaderValue::try_from(format!("Bearer {}", key.expose()))
                    .map_err(|_| "the model API key is not a valid header value")?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let transport = ChatTransport(Arc::new(ChatPost {
            transport,
            authorization,
            wire: endpoint.wire,
        }));
        let target = metrics.genai_target(genai::PROVIDER, &endpoint.model);
        let name = endpoint.name();
        let metric_label = format!("{}#{position}", endpoint.model);
        let breaker = Breaker::new(
            name.clone(),
            metric_label.clone(),
            settings.breaker,
            metrics,
        );
        let retry = &settings.retry;
        let stack = ServiceBuilder::new()
            .retry(RequestRetry::new(retry, metrics))
            .layer(BreakerLayer(breaker.clone()))
            .layer(ObserveLayer::new(metrics.clone(), target))
            .timeout(retry.timeout)
            .service(transport);
        Ok(ModelClient {
            stack: BoxCloneSyncService::new(stack),
            model: endpoint.model.as_str().into(),
            reasoning_effort: endpoint.reasoning_effort,
            wire: endpoint.wire,
            proxy,
            name: name.into(),
            metric_label: metric_label.into(),
            breaker,
            metrics: metrics.clone(),
        })
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// The forward proxy (`http://host:port`) the endpoint's requests go through, if the
    /// environment (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`) names one for it.
    pub fn proxy(&self) -> Option<&str> {
        self.proxy.as_deref()
    }

    /// The API the endpoint speaks.
    pub fn wire(&self) -> WireApi {
        self.wire
    }

    /// What the endpoint's requests say as `reasoning_effort`, if anything.
    pub fn reasoning_effort(&self) -> Option<ReasoningEffort> {
        self.reasoning_effort
    }

    /// How the log, `/health/ready` and the journal name the endpoint: `model@base_url`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How the metrics name the endpoint: `model#position`.
    pub fn metric_label(&self) -> &str {
        &self.metric_label
    }

    /// The endpoint's circuit breaker.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// The metrics this client records into, for the loop it serves.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Sends one round of the conversation and returns the model's message, with the
    /// tokens the provider counted. Each request sent (retries too) adds one to `sent`.
    /// With `failover`, a transient failure is not repeated here: the next endpoint is
    /// asked. With `live` (the request asks `stream: true`), the answer's text is
    /// published there as it comes; the message returned is the same.
    pub async fn complete(
        &self,
        request: &Arc<ChatRequest>,
        round: u32,
        sent: Arc<AtomicU32>,
        failover: bool,
        live: Option<LiveText>,
    ) -> Result<Completion, ModelError> {
        let call = ModelCall {
            chat: request.clone(),
            wire: self.wire,
            round,
            attempt: 1,
            sent,
            failover,
            on_wire: Default::default(),
            live,
        };
        let response = self.stack.clone().oneshot(call).await.map_err(|err| {
            match err.downcast::<ModelError>() {
                Ok(model_err) => *model_err,
                Err(other) => ModelError::new(ModelErrorKind::Unusable(other.to_string())),
            }
        })?;
        let message = response
            .choices
            .into_iter()
            .next()
            .map(|choice| choice.message)
            .ok_or_else(|| ModelError::unusable("the answer has no choices".into()))?;
        let calls = message.tool_calls.as_ref().map_or(0, Vec::len);
        if calls > MAX_TOOL_CALLS {
            return Err(ModelError::unusable(format!(
                "the answer asks for {calls} tool calls; at most {MAX_TOOL_CALLS} are taken from one answer"
            )));
        }
        Ok(Completion {
            message,
            usage: response.usage,
        })
    }
}

/// One round's answer.
#[derive(Clone, Debug)]
pub struct Completion {
    pub message: AssistantMessage,
    /// As the provider reported it, if it did.
    pub usage: Option<TokenUsage>,
}

/// The innermost service: one POST, one answer, no retries of its own.
#[derive(Clone)]
struct ChatTransport(Arc<ChatPost>);

/// How one chat-completions POST is made: the transport to the endpoint's URI, and the
/// Authorization header.
struct ChatPost {
    transport: Transport,
    /// `Bearer <key>`, marked sensitive.
    authorization: Option<HeaderValue>,
    /// How the answer is read: a chat completion, or a Responses answer.
    wire: WireApi,
}

impl Service<ModelCall> for ChatTransport {
    type Response = ChatResponse;
    type Error = ModelError;
    type Future = Pin<Box<dyn Future<Output = Result<ChatResponse, ModelError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ModelError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut call: ModelCall) -> Self::Future {
        let post = self.0.clone();
        // A box of its own for each: a request streamed to a watcher is the rare one, and
        // inline its future (the open request and the stream's reader) made every model
        // request's future as large (figure 2, docs/benchmark.md); boxed inside the plain
        // request's, a streamed request held both boxes while it waited (figure 12).
        match call.live.take() {
            Some(live) => Box::pin(async move { post.streamed(call, live).await }),
            None => Box::pin(async move { post.send(call).await }),
        }
    }
}

impl ChatPost {
    /// The request's head, as each attempt sends it.
    fn head(&self) -> Request<()> {
        let mut request = Request::post(self.transport.uri().clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(())
            .expect("a parsed URI and static headers make a request");
        let headers = request.headers_mut();
        if let Some(authorization) = &self.authorization {
            headers.insert(AUTHORIZATION, authorization.clone());
        }
        genai::inject_traceparent(headers);
        request
    }

    fn sending(call: &ModelCall) {
        call.sending();
        tracing::debug!(
            round = call.round,
            attempt = call.attempt,
            body = %String::from_utf8_lossy(&call.body()),
            "model request"
        );
    }

    async fn send(&self, call: ModelCall) -> Result<ChatResponse, ModelError> {
        Self::sending(&call);
        let response = self.transport.send(|| self.head(), &call).await?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let body = response.into_body();
        tracing::debug!(
            round = call.round,
            attempt = call.attempt,
            status = status.as_u16(),
            body = %String::from_utf8_lossy(&body),
            "model response"
        );
        if !status.is_success() {
            return Err(status_error(status.as_u16(), &body, retry_after));
        }
        // The body's UTF-8 checked once, not string by string as `from_slice` checks it.
        let text = std::str::from_utf8(&body)
            .map_err(|err| ModelError::unusable(format!("its body is not UTF-8 text ({err})")))?;
        match self.wire {
            WireApi::Chat => serde_json::from_str(text).map_err(|err| {
                let start: String = text.chars().take(80).collect();
                ModelError::unusable(format!(
                    "its body is not a chat completion ({err}); it starts: {start:?}"
                ))
            }),
            WireApi::Responses => responses::read_answer(text),
        }
    }
}

impl ChatPost {
    /// The answer as the provider streams it: a failure's status and body as ever, a
    /// success's events read as they come (`stream.rs`).
    async fn streamed(&self, call: ModelCall, live: LiveText) -> Result<ChatResponse, ModelError> {
        Self::sending(&call);
        // From before the request goes: a timeout or a failure at any point says Broken.
        let attempt = live.attempt();
        let response = self.transport.open(|| self.head(), &call).await?;
        let status = response.status();
        if !status.is_success() {
            let retry_after = retry_after(response.headers());
            let mut body = Vec::new();
            let mut pieces = response.into_body();
            while let Some(piece) = futures_util::StreamExt::next(&mut pieces).await {
                body.extend_from_slice(&piece?);
            }
            return Err(status_error(status.as_u16(), &body, retry_after));
        }
        let answer = match self.wire {
            WireApi::Chat => stream::read(response.into_body(), attempt).await,
            WireApi::Responses => responses_stream::read(response.into_body(), attempt).await,
        };
        tracing::debug!(
            round = call.round,
            attempt = call.attempt,
            status = status.as_u16(),
            answer = ?answer,
            "model response (streamed)"
        );
        answer
    }
}

/// `Retry-After` as delay-seconds or an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(
        date.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// A provider's answer that is not a success: its status, its error body's fields (and,
/// for a refusal of the request's reasoning effort, the settings that fix it), and how
/// long it asked us to wait.
fn status_error(status: u16, body: &[u8], retry_after: Option<Duration>) -> ModelError {
    let (code, mut message) = error_fields(status, body);
    if let Some(hint) = reasoning::refusal_hint(status, body) {
        message = format!("{message} ({hint})");
    }
    ModelError::new(ModelErrorKind::Status {
        status,
        code,
        message,
        retry_after,
    })
}

/// The `code` and `message` of an OpenAI-style error body, or the body's start. A numeric
/// code that repeats the status (llama.cpp's `"code": 401`) is dropped: it says nothing the
/// status does not.
fn error_fields(status: u16, body: &[u8]) -> (Option<String>, String) {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let code = error.and_then(|e| e.get("code")).and_then(|c| match c {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) if n.as_u64() != Some(u64::from(status)) => {
            Some(n.to_string())
        }
        _ => None,
    });
    let message = error
        .and_then(|e| {
            e.get("message")
                .and_then(|m| m.as_str())
                .or_else(|| e.as_str())
        })
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    (code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        let in_two = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2));
        headers.insert(RETRY_AFTER, HeaderValue::from_str(&in_two).unwrap());
        let wait = retry_after(&headers).unwrap();
        assert!(
            wait <= Duration::from_secs(2) && wait >= Duration::from_secs(1),
            "{wait:?}"
        );
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn error_bodies_give_their_code() {
        let body = br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        assert_eq!(
            error_fields(429, body),
            (
                Some("insufficient_quota".into()),
                "You exceeded your current quota".into()
            )
        );
        assert_eq!(
            error_fields(502, b"upstream down"),
            (None, "upstream down".into())
        );
    }

    #[test]
    fn a_numeric_code_is_kept_only_when_it_is_not_the_status() {
        let llama =
            br#"{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}"#;
        assert_eq!(error_fields(401, llama), (None, "Invalid API Key".into()));
        assert_eq!(
            error_fields(400, br#"{"error":{"message":"m","code":1042}}"#),
            (Some("1042".into()), "m".into())
        );
    }

    #[test]
    fn secrets_do_not_print() {
        let endpoint = ModelEndpoint {
            base_url: "http://x".into(),
            api_key: Some(Secret::new("sk-live-123")),
            model: "m".into(),
            h2c: false,
            reasoning_effort: None,
            wire: WireApi::Chat,
        };
        assert!(!format!("{endpoint:?}").contains("sk-live-123"));
    }
}
