//! The payment provider: Stripe's PaymentIntents API, the subset a checkout needs, written
//! by hand. (Stripe's own crates make a new idempotency key for each retry; here the key is
//! the intent's, made before the first request and sent with every one.)
//!
//! provider retry (`retry.rs`) ─► observe (`observe.rs`) ─► provider timeout ─► one
//! reqwest request (`transport.rs`): the unit is one HTTP request; what is sent and what
//! the responses say is in `wire.rs`. Each request of a charge carries the same `Idempotency-Key` and the same
//! form, so Stripe executes it once and answers every repeat with its saved result.

mod observe;
mod refunds;
mod retry;
mod transport;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use super::store::Intent;
use crate::metrics::Metrics;
use crate::retry::jittered_backoff;
use crate::secret::Secret;
pub use refunds::{RefundAnswer, RefundCall};
use retry::ProviderRetry;
use transport::StripeApi;
use wire::{Call, ProviderResponse, Request, created, describe, of_intent, status_error};

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
    stack: BoxCloneSyncService<Call, ProviderResponse, BoxError>,
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
        let api = StripeApi {
            http: reqwest::Client::builder().tcp_nodelay(true).build()?,
            create: reqwest::Url::parse(&format!("{base}/v1/payment_intents"))?,
            search: reqwest::Url::parse(&format!("{base}/v1/payment_intents/search"))?,
            refunds: reqwest::Url::parse(&format!("{base}/v1/refunds"))?,
            api_key: settings.api_key.clone(),
        };
        let stack = ServiceBuilder::new()
            .retry(ProviderRetry::new(
                settings.max_retries,
                jittered_backoff(settings.backoff_min, settings.backoff_max),
                metrics,
            ))
            .layer_fn(|inner| observe::observe(inner, metrics.clone()))
            .timeout(settings.timeout)
            .service(transport::transport(api));
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
            Ok(response) => match created(&response, &intent.provider_key) {
                Err(ProviderError::Unavailable(why)) => why,
                other => return other,
            },
            Err(err) => describe(&err),
        };
        tracing::warn!(order = %intent.order_id, attempt = intent.attempt, failure = %failure, "payment provider: no outcome after the provider retry; looking the payment up by its metadata");
        match self.find(intent).await? {
            Some(outcome) => Ok(outcome),
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
        let response = self
            .stack
            .clone()
            .oneshot(call)
            .await
            .map_err(|err| ProviderError::Unavailable(describe(&err)))?;
        if response.status != 200 {
            return Err(status_error(&response));
        }
        let body = response.json()?;
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
