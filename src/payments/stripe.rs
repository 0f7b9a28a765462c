//! The payment provider: Stripe's PaymentIntents API, the subset a checkout needs, written
//! by hand. (Stripe's own crates make a new idempotency key for each retry; here the key is
//! the intent's, made before the first request and sent with every one.)
//!
//! provider retry ─► observe ─► provider timeout ─► one reqwest request (the unit: one
//! HTTP request). Each request of a charge carries the same `Idempotency-Key` and the same
//! form, so Stripe executes it once and answers every repeat with its saved result.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use serde_json::Value;
use tower::retry::Policy;
use tower::retry::backoff::{Backoff, ExponentialBackoff};
use tower::util::BoxCloneSyncService;
use tower::util::rng::HasherRng;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

use super::store::Intent;
use crate::metrics::{Metrics, RetryLayer};
use crate::retry::jittered_backoff;
use crate::secret::Secret;
use crate::telemetry::genai;

/// Where the provider is, how to reach it, and how long it keeps an idempotency key.
#[derive(Clone, Debug)]
pub struct StripeSettings {
    /// `https://api.stripe.com`, or a server speaking its subset.
    pub base_url: String,
    pub api_key: Secret,
    /// One HTTP request to the provider.
    pub timeout: Duration,
    pub max_retries: u32,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// How long the provider answers a repeated key with its saved result (Stripe: 24 h).
    /// An intent older than this is settled by a look-up, never by sending it again.
    pub key_retention: Duration,
}

/// What the provider did with a charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PaymentOutcome {
    Succeeded {
        payment_id: String,
    },
    /// The customer must act (3-D Secure); completing it is out of scope.
    RequiresAction {
        payment_id: String,
    },
    Declined {
        payment_id: Option<String>,
        decline_code: String,
        message: String,
    },
}

/// A provider request that gave no outcome.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// Stripe's 400 `idempotency_error`: the key was first used with other parameters.
    /// Our keys are sent only with their intent's parameters, so this is a bug.
    #[error(
        "the payment provider refused Idempotency-Key {key:?}: it was first used with other parameters ({message}); a bug, logged; nothing further was sent"
    )]
    ParametersDiffer { key: String, message: String },
    /// Another 4xx: a bad API key, a request the provider will not take.
    #[error("the payment provider refused the request: {status} {code}: {message}")]
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    /// 5xx, 409 in use, timeouts, dropped connections, after the provider retry and a
    /// look-up: the payment may or may not exist; a repeat sends the same key.
    #[error("the payment provider gave no outcome: {0}")]
    Unavailable(String),
    /// Beyond the key retention, the look-up found no payment of this attempt.
    #[error(
        "attempt {attempt} is older than the provider's key retention and no payment of it was found: nothing was charged under it; the next checkout makes a new attempt"
    )]
    Absent { attempt: i64 },
    #[error("the payment provider's answer does not read: {0}")]
    Malformed(String),
}

impl ProviderError {
    /// A repeat (the loop retry, the client's) may get the outcome.
    pub fn is_transient(&self) -> bool {
        matches!(self, ProviderError::Unavailable(_))
    }

    /// The provider provably made no payment for this request.
    pub fn charged_nothing(&self) -> bool {
        matches!(
            self,
            ProviderError::Refused { .. } | ProviderError::Absent { .. }
        )
    }

    /// A short stable name, for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            ProviderError::ParametersDiffer { .. } => "provider_idempotency_error",
            ProviderError::Refused { .. } => "provider_refused",
            ProviderError::Unavailable(_) => "provider_unavailable",
            ProviderError::Absent { .. } => "provider_absent",
            ProviderError::Malformed(_) => "provider_malformed",
        }
    }
}

/// The Stripe client, retries and timeout included.
#[derive(Clone)]
pub struct Stripe {
    stack: BoxCloneSyncService<Call, Reply, BoxError>,
    settings: Arc<StripeSettings>,
}

impl std::fmt::Debug for Stripe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stripe")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Stripe {
    pub fn new(settings: &StripeSettings, metrics: &Metrics) -> Result<Stripe, BoxError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = settings.base_url.trim_end_matches('/');
        let transport = StripeTransport(Arc::new(Endpoint {
            http: reqwest::Client::builder().tcp_nodelay(true).build()?,
            create: reqwest::Url::parse(&format!("{base}/v1/payment_intents"))?,
            search: reqwest::Url::parse(&format!("{base}/v1/payment_intents/search"))?,
            api_key: settings.api_key.clone(),
        }));
        let stack = ServiceBuilder::new()
            .retry(ProviderRetry {
                max_retries: settings.max_retries,
                backoff: jittered_backoff(settings.backoff_min, settings.backoff_max),
                attempts: 0,
                metrics: metrics.clone(),
            })
            .layer_fn(|inner| Observed {
                inner,
                metrics: metrics.clone(),
            })
            .timeout(settings.timeout)
            .service(transport);
        Ok(Stripe {
            stack: BoxCloneSyncService::new(stack),
            settings: Arc::new(settings.clone()),
        })
    }

    pub fn key_retention(&self) -> Duration {
        self.settings.key_retention
    }

    /// Sends the intent's charge (`POST /v1/payment_intents`, confirmed at once) under its
    /// key, with its parameters, retried with the same key; when no retry brought an
    /// outcome, looks the payment up (a saved 500 answers every repeat of its key).
    pub async fn create(&self, intent: &Intent) -> Result<PaymentOutcome, ProviderError> {
        let mut form = reqwest::Url::parse("http://form/").expect("a valid URL");
        form.query_pairs_mut()
            .append_pair("amount", &intent.amount_minor.to_string())
            .append_pair("currency", &intent.currency.to_ascii_lowercase())
            .append_pair("confirm", "true")
            .append_pair("payment_method", &intent.payment_method)
            .append_pair("metadata[order_id]", &intent.order_id)
            .append_pair("metadata[operation_key]", &intent.operation_key)
            .append_pair("metadata[attempt]", &intent.attempt.to_string());
        let call = Call {
            request: Request::Create {
                key: intent.provider_key.as_str().into(),
                form: Bytes::from(form.query().unwrap_or_default().to_owned()),
            },
        };
        let failure = match self.stack.clone().oneshot(call).await {
            Ok(reply) => match created(&reply, &intent.provider_key) {
                Err(ProviderError::Unavailable(why)) => why,
                other => return other,
            },
            Err(err) => describe(&err),
        };
        tracing::warn!(order = %intent.order_id, attempt = intent.attempt, failure = %failure, "payment provider: no outcome after the provider retry; looking the payment up by its metadata");
        match self.find(intent).await? {
            Some(answer) => Ok(answer),
            None => Err(ProviderError::Unavailable(format!(
                "{failure}; no payment of attempt {} is found by its metadata yet",
                intent.attempt
            ))),
        }
    }

    /// Looks the intent's payment up by its metadata (order id and attempt): the way to
    /// settle an intent whose key the provider no longer keeps. `None`: no such payment.
    pub async fn find(&self, intent: &Intent) -> Result<Option<PaymentOutcome>, ProviderError> {
        let call = Call {
            request: Request::Search {
                query: format!("metadata['order_id']:'{}'", intent.order_id).into(),
            },
        };
        let reply = self
            .stack
            .clone()
            .oneshot(call)
            .await
            .map_err(|err| ProviderError::Unavailable(describe(&err)))?;
        if reply.status != 200 {
            return Err(status_error(&reply));
        }
        let body = reply.json()?;
        let attempt = intent.attempt.to_string();
        let found = body["data"].as_array().and_then(|payments| {
            payments.iter().find(|p| {
                p["metadata"]["order_id"] == intent.order_id.as_str()
                    && p["metadata"]["attempt"] == attempt.as_str()
            })
        });
        found.map(of_intent).transpose()
    }
}

/// What a `POST /v1/payment_intents` answer says.
fn created(reply: &Reply, key: &str) -> Result<PaymentOutcome, ProviderError> {
    match reply.status {
        200 => of_intent(&reply.json()?),
        402 => {
            let body = reply.json()?;
            let error = &body["error"];
            let payment = &error["payment_intent"];
            Ok(PaymentOutcome::Declined {
                payment_id: payment["id"].as_str().map(str::to_owned),
                decline_code: error["decline_code"]
                    .as_str()
                    .or(error["code"].as_str())
                    .unwrap_or("card_declined")
                    .to_owned(),
                message: error["message"].as_str().unwrap_or_default().to_owned(),
            })
        }
        400 if error_type(reply) == Some("idempotency_error".into()) => {
            let message = reply
                .json()
                .ok()
                .and_then(|b| b["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_default();
            tracing::error!(
                provider_key = key,
                message = %message,
                "BUG: the payment provider says this Idempotency-Key was first sent with other parameters; a key is only ever sent with its intent's parameters. Nothing further is sent for it"
            );
            Err(ProviderError::ParametersDiffer {
                key: key.to_owned(),
                message,
            })
        }
        _ => Err(status_error(reply)),
    }
}

/// A PaymentIntent object's outcome.
fn of_intent(payment: &Value) -> Result<PaymentOutcome, ProviderError> {
    let id = payment["id"]
        .as_str()
        .ok_or_else(|| ProviderError::Malformed("a payment intent without an id".into()))?
        .to_owned();
    let last_error = &payment["last_payment_error"];
    match payment["status"].as_str().unwrap_or_default() {
        "succeeded" => Ok(PaymentOutcome::Succeeded { payment_id: id }),
        "requires_action" => Ok(PaymentOutcome::RequiresAction { payment_id: id }),
        "requires_payment_method" | "canceled" => Ok(PaymentOutcome::Declined {
            payment_id: Some(id),
            decline_code: last_error["decline_code"]
                .as_str()
                .or(last_error["code"].as_str())
                .unwrap_or("canceled")
                .to_owned(),
            message: last_error["message"]
                .as_str()
                .unwrap_or("the payment did not go through")
                .to_owned(),
        }),
        other => Err(ProviderError::Unavailable(format!(
            "payment {id} is {other:?}, not yet settled"
        ))),
    }
}

fn error_type(reply: &Reply) -> Option<String> {
    let body = reply.json().ok()?;
    body["error"]["type"].as_str().map(str::to_owned)
}

fn status_error(reply: &Reply) -> ProviderError {
    let body = reply.json().unwrap_or_default();
    let error = &body["error"];
    let code = error["code"]
        .as_str()
        .or(error["type"].as_str())
        .unwrap_or_default()
        .to_owned();
    let message = error["message"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| {
            String::from_utf8_lossy(&reply.body[..reply.body.len().min(200)]).into()
        });
    match reply.status {
        409 | 429 | 500.. => ProviderError::Unavailable(format!(
            "the payment provider answered {} {code}: {message}",
            reply.status
        )),
        status => ProviderError::Refused {
            status,
            code,
            message,
        },
    }
}

fn describe(err: &BoxError) -> String {
    if err.is::<tower::timeout::error::Elapsed>() {
        "the payment provider did not answer in time".into()
    } else {
        format!("the payment provider could not be reached: {err}")
    }
}

/// One request of the unit the provider retry repeats.
#[derive(Clone)]
struct Call {
    request: Request,
}

#[derive(Clone)]
enum Request {
    Create { key: Arc<str>, form: Bytes },
    Search { query: Arc<str> },
}

impl Call {
    fn operation(&self) -> &'static str {
        match self.request {
            Request::Create { .. } => "create",
            Request::Search { .. } => "search",
        }
    }
}

/// Any HTTP answer: the retry policy and the caller read the status.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Result<Value, ProviderError> {
        serde_json::from_slice(&self.body).map_err(|err| {
            ProviderError::Malformed(format!("{err}: {}", String::from_utf8_lossy(&self.body)))
        })
    }

    /// The metrics outcome of an answer.
    fn outcome(&self) -> &'static str {
        let status = self.json().ok();
        let field = |path: [&str; 2]| {
            status
                .as_ref()
                .and_then(|b| b[path[0]][path[1]].as_str().map(str::to_owned))
        };
        match self.status {
            200 => match status.as_ref().and_then(|b| b["status"].as_str()) {
                Some("succeeded") => "succeeded",
                Some("requires_action") => "requires_action",
                Some(_) => "other",
                None if status.is_some() => "answered",
                None => "malformed",
            },
            402 => "declined",
            409 => "in_use",
            400 if field(["error", "type"]).as_deref() == Some("idempotency_error") => {
                "idempotency_error"
            }
            500.. => "server_error",
            _ => "refused",
        }
    }
}

/// The innermost service: one request, no retries of its own.
#[derive(Clone)]
struct StripeTransport(Arc<Endpoint>);

struct Endpoint {
    http: reqwest::Client,
    create: reqwest::Url,
    search: reqwest::Url,
    api_key: Secret,
}

impl Service<Call> for StripeTransport {
    type Response = Reply;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: Call) -> Self::Future {
        let endpoint = self.0.clone();
        Box::pin(async move {
            let mut headers = HeaderMap::new();
            genai::inject_traceparent(&mut headers);
            let request = match call.request {
                Request::Create { key, form } => endpoint
                    .http
                    .post(endpoint.create.clone())
                    .header("Idempotency-Key", key.as_ref())
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(form),
                Request::Search { query } => {
                    let mut url = endpoint.search.clone();
                    url.query_pairs_mut().append_pair("query", &query);
                    endpoint.http.get(url)
                }
            };
            let response = request
                .headers(headers)
                .bearer_auth(endpoint.api_key.expose())
                .send()
                .await?;
            let status = response.status().as_u16();
            let body = response.bytes().await?;
            Ok(Reply { status, body })
        })
    }
}

/// Counts and times each request (each retry its own), timeouts included.
#[derive(Clone)]
struct Observed<S> {
    inner: S,
    metrics: Metrics,
}

impl<S> Service<Call> for Observed<S>
where
    S: Service<Call, Response = Reply, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Reply;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call) -> Self::Future {
        let operation = call.operation();
        let metrics = self.metrics.clone();
        let sent = self.inner.call(call);
        Box::pin(async move {
            let started = Instant::now();
            let result = sent.await;
            let outcome = match &result {
                Ok(reply) => reply.outcome(),
                Err(err) if err.is::<tower::timeout::error::Elapsed>() => "timeout",
                Err(_) => "transport",
            };
            metrics.provider_request(operation, outcome, started.elapsed());
            result
        })
    }
}

/// Repeats one provider request, with the same key and form: on a timeout, a failed or
/// dropped connection, 409 `idempotency_key_in_use`, 429 and 5xx. Never on another 4xx
/// (402 is an answer; 400 `idempotency_error` is a bug, not a blip).
#[derive(Clone)]
struct ProviderRetry {
    max_retries: u32,
    backoff: ExponentialBackoff<HasherRng>,
    attempts: u32,
    metrics: Metrics,
}

impl Policy<Call, Reply, BoxError> for ProviderRetry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _call: &mut Call,
        result: &mut Result<Reply, BoxError>,
    ) -> Option<Self::Future> {
        let reason = match result {
            Ok(reply) if reply.status == 409 => "in_use",
            Ok(reply) if reply.status == 429 => "rate_limited",
            Ok(reply) if reply.status >= 500 => "server_error",
            Ok(_) => return None,
            Err(err) if err.is::<tower::timeout::error::Elapsed>() => "timeout",
            Err(_) => "transport",
        };
        self.attempts += 1;
        if self.attempts > self.max_retries {
            return None;
        }
        self.metrics.retry(RetryLayer::Provider, reason);
        tracing::info!(
            attempt = self.attempts + 1,
            reason,
            "provider retry: re-sending one payment-provider request with the same Idempotency-Key"
        );
        Some(self.backoff.next_backoff())
    }

    fn clone_request(&mut self, call: &Call) -> Option<Call> {
        Some(call.clone())
    }
}
