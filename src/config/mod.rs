//! Settings: defaults ← config file ← environment ← command line.
//!
//! Every setting has one file key and one environment variable (the table in
//! `SETTINGS`); a bad value is one error naming both, and the process exits with 2.
//! The sections are here, the table of names in `table.rs`, the reading in `load.rs`.

mod error;
mod fallbacks;
mod load;
mod table;
#[cfg(test)]
mod tests;

pub use error::{ConfigError, SettingError};
pub use load::Sources;
pub use table::SETTINGS;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::assistant::LoopRetrySettings;
use crate::db::PoolSettings;
use crate::model::scripted::FaultRule;
use crate::model::{
    BreakerSettings, ModelEndpoint, ReasoningEffort, RequestRetrySettings, TransportSettings,
    WireApi,
};
use crate::outbox::MailSettings;
use crate::payments::PerCurrency;
use crate::payments::stripe::StripeSettings;
use crate::secret::Secret;
use crate::telemetry::LogFormat;
use crate::webhooks::WebhookSettings;

pub const DEFAULT_CONFIG: &str = "config/default.toml";
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
pub const STRIPE_BASE_URL: &str = "https://api.stripe.com";

/// Every setting, nested by the part of the service it concerns. A section that one part
/// of the service takes whole is that part's own type (the request retry's, the loop
/// retry's, the pool's), so the settings reach it without being copied field by field.
#[derive(Clone, Debug)]
pub struct Settings {
    pub server: ServerSettings,
    pub payments: PaymentSettings,
    pub database: DatabaseSettings,
    pub model: ModelSettings,
    /// One chat-completions request: its timeout and retry.
    pub model_request: RequestRetrySettings,
    /// The whole assistant loop: its timeout, retry and rounds.
    pub assistant: AssistantSettings,
    pub idempotency: IdempotencySettings,
    /// How much work the instance takes: loops at once, per caller, connections.
    pub overload: OverloadSettings,
    /// The built-in model, when no provider is configured.
    pub scripted: ScriptedSettings,
    /// The confirmation email: where it goes, from whom, how it is retried.
    pub mail: MailSettings,
    /// The operator's webhook endpoint: which events, signed how, retried when.
    pub webhooks: WebhookSettings,
    pub log_format: LogFormat,
}

/// The HTTP server.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    /// The most one HTTP request may take.
    pub timeout: Duration,
    pub body_limit_bytes: usize,
    /// When a caller must send an API key (`CHECKOUT_AUTH`).
    pub auth: AuthMode,
}

/// `CHECKOUT_AUTH`: when a caller must send an API key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Open while no API key exists (a revoked one counts) and only on a loopback
    /// address; keys required once one exists.
    Auto,
    /// A valid key on every request, even while none exists.
    Required,
    /// Open on any address: no key is asked for or read.
    Off,
}

impl AuthMode {
    pub fn parse(v: &str) -> Result<AuthMode, String> {
        match v {
            "auto" => Ok(AuthMode::Auto),
            "required" => Ok(AuthMode::Required),
            "off" => Ok(AuthMode::Off),
            _ => Err(format!("{v:?} is none of auto, required, off")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::Auto => "auto",
            AuthMode::Required => "required",
            AuthMode::Off => "off",
        }
    }
}

#[derive(Clone, Debug)]
pub struct PaymentSettings {
    /// The largest amount accepted, in whole units of the currency.
    pub max_amount: u64,
    /// Who moves the money (`CHECKOUT_PAYMENT_PROVIDER`).
    pub provider: PaymentProvider,
    pub stripe_base_url: String,
    /// Required with `stripe`; a secret, never logged.
    pub stripe_api_key: Option<Secret>,
    /// How long the provider keeps an idempotency key's result (Stripe: 24 h).
    pub key_retention: Duration,
    /// One request to the provider: its timeout, retries and the backoff between them
    /// (its own, not the model's: the two have different peers and limits).
    pub timeout: Duration,
    pub max_retries: u32,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Charges above these amounts wait for a person's approval (`CHECKOUT_APPROVAL_ABOVE`).
    pub approval_above: PerCurrency,
    /// How long an approval waits for a decision (`CHECKOUT_APPROVAL_TTL_SECS`).
    pub approval_ttl: Duration,
    /// What one caller may be charged for per UTC day (`CHECKOUT_BUDGET_PER_DAY`).
    pub budget_per_day: PerCurrency,
}

/// Who moves the money.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaymentProvider {
    /// The receipts table is the ledger; nothing else is asked (the default).
    Ledger,
    /// Stripe's PaymentIntents API, or a server speaking its subset.
    Stripe,
}

impl PaymentProvider {
    fn parse(v: &str) -> Result<PaymentProvider, String> {
        match v {
            "ledger" => Ok(PaymentProvider::Ledger),
            "stripe" => Ok(PaymentProvider::Stripe),
            _ => Err(format!("{v:?} is neither ledger nor stripe")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct DatabaseSettings {
    pub url: String,
    pub pool: PoolSettings,
}

/// Which model, where; see [`Settings::model_source`].
#[derive(Clone, Debug)]
pub struct ModelSettings {
    pub base_url: Option<String>,
    pub api_key: Option<Secret>,
    pub name: String,
    pub h2c: bool,
    /// `OPENAI_REASONING_EFFORT`: none sent when unset.
    pub reasoning_effort: Option<ReasoningEffort>,
    /// `OPENAI_WIRE_API`: chat completions (the default) or the Responses API.
    pub wire_api: WireApi,
    /// `OPENAI_FALLBACK_*`: the first fallback endpoint; its model, reasoning effort and
    /// wire default to the primary's, its key to none.
    pub fallback_base_url: Option<String>,
    pub fallback_api_key: Option<Secret>,
    pub fallback_model: Option<String>,
    pub fallback_reasoning_effort: Option<ReasoningEffort>,
    pub fallback_wire_api: Option<WireApi>,
    /// The fallbacks after it, from the config file (`model_fallbacks`).
    pub file_fallbacks: Vec<ModelEndpoint>,
    /// Every endpoint's circuit breaker.
    pub breaker: BreakerSettings,
    /// Every endpoint's connections, and how much of an answer is read.
    pub transport: TransportSettings,
}

#[derive(Clone, Debug)]
pub struct AssistantSettings {
    pub retry: LoopRetrySettings,
    /// Model rounds (requests) per loop attempt.
    pub max_rounds: u32,
    /// Times a model that ends without charging is asked again to charge.
    pub max_nudges: u32,
    /// Journal every step, so that a retry resumes the loop instead of restarting it.
    pub journal: bool,
}

#[derive(Clone, Debug)]
pub struct IdempotencySettings {
    /// How long a key and its answer are kept.
    pub ttl: Duration,
    /// How long a key's owner holds it unrenewed.
    pub lease: Duration,
    /// The recovery sweep: resume operations whose lease lapsed unfinished.
    pub recovery: bool,
    /// Times the sweep resumes one operation before it marks it as needing attention.
    pub recovery_max_attempts: u32,
}

/// How much work one instance takes, so that too much is refused cleanly.
#[derive(Clone, Debug)]
pub struct OverloadSettings {
    /// Checkout loops running at once; lowered at start-up to what the descriptor limit
    /// carries.
    pub max_in_flight: usize,
    /// Checkouts per second per caller (GCRA); 0: no rate limit.
    pub rate_per_sec: u32,
    /// Checkouts a caller may send at once; 0: twice the rate.
    pub rate_burst: u32,
    /// A connection that has not sent a whole request head within this is closed.
    pub header_timeout: Duration,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// Open client connections; 0: what the descriptor limit leaves after the loops, the
    /// database and the model.
    pub max_connections: usize,
}

/// The default bound on loops: what 10,000 loops hold ([`BYTES_PER_LOOP_H2C`] each over
/// h2c) fits a small instance, as figure 2 of docs/benchmark.md checks at 10,000 in
/// flight.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 10_000;

/// Memory one waiting loop holds, by how its model requests travel: what the start-up
/// line multiplies the bound on loops by. Measured by figure 2 of docs/benchmark.md
/// (`cargo run --release -p checkout-bench -- --only loops`, `--http1` for HTTP/1.1,
/// `https://` against a TLS model server); update them from its latest run, here only.
/// Over `http://`, the `h2` crate's own connections.
pub const BYTES_PER_LOOP_H2C: usize = 12_600;
/// To an `https://` provider, through hyper-util's pooled client's HTTP/2.
pub const BYTES_PER_LOOP_HTTPS: usize = 21_000;
/// Over HTTP/1.1, a connection each way.
pub const BYTES_PER_LOOP_HTTP1: usize = 47_000;

impl OverloadSettings {
    /// The burst the rate limit allows (twice the rate unless set).
    pub fn burst(&self) -> u32 {
        match self.rate_burst {
            0 => self.rate_per_sec.saturating_mul(2),
            burst => burst,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ScriptedSettings {
    pub faults: Vec<FaultRule>,
    pub delay: Duration,
}

/// Which model the service talks to.
#[derive(Clone, Debug)]
pub enum ModelSource {
    /// No key and no base URL: the built-in scripted model, started on loopback.
    Scripted {
        faults: Vec<FaultRule>,
        delay: Duration,
    },
    /// OpenAI or any compatible server.
    Remote(ModelEndpoint),
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            server: ServerSettings {
                listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
                timeout: Duration::from_millis(100_000),
                body_limit_bytes: 16 * 1024,
                auth: AuthMode::Auto,
            },
            payments: PaymentSettings {
                max_amount: 1_000_000,
                provider: PaymentProvider::Ledger,
                stripe_base_url: STRIPE_BASE_URL.into(),
                stripe_api_key: None,
                key_retention: Duration::from_secs(24 * 60 * 60),
                timeout: Duration::from_millis(10_000),
                max_retries: 2,
                backoff_min: Duration::from_millis(200),
                backoff_max: Duration::from_millis(2_000),
                approval_above: PerCurrency::default(),
                approval_ttl: Duration::from_secs(86_400),
                budget_per_day: PerCurrency::default(),
            },
            database: DatabaseSettings {
                url: "sqlite://checkout.db".into(),
                pool: PoolSettings {
                    max_connections: 16,
                    acquire_timeout: Duration::from_millis(2_000),
                },
            },
            model: ModelSettings {
                base_url: None,
                api_key: None,
                name: "gpt-4o-mini".into(),
                h2c: false,
                reasoning_effort: None,
                wire_api: WireApi::Chat,
                fallback_base_url: None,
                fallback_api_key: None,
                fallback_model: None,
                fallback_reasoning_effort: None,
                fallback_wire_api: None,
                file_fallbacks: Vec::new(),
                breaker: BreakerSettings {
                    window: 20,
                    failure_percent: 100,
                    open: Duration::from_millis(5_000),
                },
                transport: TransportSettings::default(),
            },
            model_request: RequestRetrySettings {
                timeout: Duration::from_millis(10_000),
                max_retries: 2,
                backoff_min: Duration::from_millis(200),
                backoff_max: Duration::from_millis(2_000),
                retry_after_max: Duration::from_millis(5_000),
                budget_percent: 50,
                budget_min_per_sec: 10,
            },
            assistant: AssistantSettings {
                retry: LoopRetrySettings {
                    timeout: Duration::from_millis(30_000),
                    max_retries: 2,
                    backoff_min: Duration::from_millis(100),
                    backoff_max: Duration::from_millis(1_000),
                },
                max_rounds: 10,
                max_nudges: 2,
                journal: true,
            },
            idempotency: IdempotencySettings {
                ttl: Duration::from_secs(24 * 60 * 60),
                lease: Duration::from_millis(10_000),
                recovery: true,
                recovery_max_attempts: 3,
            },
            overload: OverloadSettings {
                max_in_flight: DEFAULT_MAX_IN_FLIGHT,
                rate_per_sec: 0,
                rate_burst: 0,
                header_timeout: Duration::from_millis(10_000),
                idle_timeout: Duration::from_millis(60_000),
                max_connections: 0,
            },
            scripted: ScriptedSettings {
                faults: Vec::new(),
                delay: Duration::ZERO,
            },
            mail: MailSettings {
                smtp_url: None,
                dir: PathBuf::from("mail"),
                from: "checkout@localhost".parse().expect("a mailbox"),
                lease: Duration::from_millis(60_000),
                max_attempts: 8,
                backoff_min: Duration::from_millis(1_000),
                backoff_max: Duration::from_millis(300_000),
            },
            webhooks: WebhookSettings::default(),
            log_format: LogFormat::Text,
        }
    }
}

impl Settings {
    /// Combinations that cannot work.
    fn check(&self) -> Result<(), ConfigError> {
        let ms = |d: Duration| d.as_millis();
        if self.assistant.retry.timeout <= self.model_request.timeout {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_LOOP_TIMEOUT_MS ({}) must be longer than CHECKOUT_REQUEST_TIMEOUT_MS ({}): a loop that cannot outlast one model request can never finish a round",
                ms(self.assistant.retry.timeout),
                ms(self.model_request.timeout)
            )));
        }
        let worst = self.loop_worst_case();
        if self.server.timeout < worst {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_SERVER_TIMEOUT_MS ({}) is shorter than the worst case of the loop layers inside it ({} = {} loop attempts x {} ms + backoff): the server would cut off a checkout its own retries still run",
                ms(self.server.timeout),
                ms(worst),
                self.assistant.retry.max_retries + 1,
                ms(self.assistant.retry.timeout)
            )));
        }
        if self.model_request.backoff_min > self.model_request.backoff_max {
            return Err(ConfigError::Combination(
                "CHECKOUT_REQUEST_BACKOFF_MS must not exceed CHECKOUT_REQUEST_BACKOFF_MAX_MS"
                    .into(),
            ));
        }
        if self.assistant.retry.backoff_min > self.assistant.retry.backoff_max {
            return Err(ConfigError::Combination(
                "CHECKOUT_LOOP_BACKOFF_MS must not exceed CHECKOUT_LOOP_BACKOFF_MAX_MS".into(),
            ));
        }
        if self.payments.backoff_min > self.payments.backoff_max {
            return Err(ConfigError::Combination(
                "CHECKOUT_PROVIDER_BACKOFF_MS must not exceed CHECKOUT_PROVIDER_BACKOFF_MAX_MS"
                    .into(),
            ));
        }
        if self.mail.backoff_min > self.mail.backoff_max {
            return Err(ConfigError::Combination(
                "CHECKOUT_MAIL_BACKOFF_MS must not exceed CHECKOUT_MAIL_BACKOFF_MAX_MS".into(),
            ));
        }
        if self.idempotency.ttl <= self.server.timeout {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_IDEMPOTENCY_TTL_SECS ({} s) must be longer than CHECKOUT_SERVER_TIMEOUT_MS ({} ms): a key must outlive the request that holds it",
                self.idempotency.ttl.as_secs(),
                ms(self.server.timeout)
            )));
        }
        if let ModelSource::Remote(endpoint) = self.model_source()
            && self.model.h2c
            && !endpoint.base_url.starts_with("http://")
        {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_MODEL_H2C applies to an http:// model URL, not {}: over https the provider and the client agree on HTTP/2 themselves (ALPN)",
                endpoint.base_url
            )));
        }
        if self.payments.provider == PaymentProvider::Stripe
            && self.payments.stripe_api_key.is_none()
        {
            return Err(SettingError {
                env: "STRIPE_API_KEY",
                key: "stripe_api_key",
                message: "is required with CHECKOUT_PAYMENT_PROVIDER=stripe (a test-mode key sk_test_… to try it)".into(),
            }
            .into());
        }
        if self.webhooks.url.is_some() && self.webhooks.secret.is_none() {
            return Err(SettingError {
                env: "CHECKOUT_WEBHOOK_SECRET",
                key: "webhook_secret",
                message: "is required with CHECKOUT_WEBHOOK_URL (whsec_ + base64 of 24 to 64 random bytes: every event is signed with it)".into(),
            }
            .into());
        }
        if self.webhooks.lease <= self.webhooks.timeout {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_WEBHOOK_LEASE_MS ({}) must be longer than CHECKOUT_WEBHOOK_TIMEOUT_MS ({}): another instance would send an event while its attempt still runs",
                ms(self.webhooks.lease),
                ms(self.webhooks.timeout)
            )));
        }
        if self.overload.rate_burst > 0 && self.overload.rate_per_sec == 0 {
            return Err(ConfigError::Combination(
                "CHECKOUT_RATE_LIMIT_BURST is set but CHECKOUT_RATE_LIMIT_PER_SEC is 0 (no rate limit): set the rate too, or leave the burst at 0".into(),
            ));
        }
        self.check_fallbacks()?;
        let scripted_options = !self.scripted.faults.is_empty() || !self.scripted.delay.is_zero();
        if scripted_options && matches!(self.model_source(), ModelSource::Remote(_)) {
            return Err(ConfigError::Combination(
                "CHECKOUT_SCRIPTED_FAULTS and CHECKOUT_SCRIPTED_DELAY_MS apply to the scripted model, but OPENAI_API_KEY or OPENAI_BASE_URL is set".into(),
            ));
        }
        Ok(())
    }

    /// The longest the loop layers can take: every attempt timing out, with the longest
    /// backoff between attempts.
    pub fn loop_worst_case(&self) -> Duration {
        let retry = &self.assistant.retry;
        retry.timeout * (retry.max_retries + 1) + retry.backoff_max * retry.max_retries
    }

    /// The payment provider's settings, when one takes the payments.
    pub fn stripe(&self) -> Option<StripeSettings> {
        let payments = &self.payments;
        if payments.provider != PaymentProvider::Stripe {
            return None;
        }
        Some(StripeSettings {
            base_url: payments.stripe_base_url.clone(),
            api_key: payments.stripe_api_key.clone()?,
            timeout: payments.timeout,
            max_retries: payments.max_retries,
            backoff_min: payments.backoff_min,
            backoff_max: payments.backoff_max,
            key_retention: payments.key_retention,
        })
    }

    /// The model is an `https://` provider: its protocol is what ALPN picks, whatever
    /// `CHECKOUT_MODEL_H2C` says.
    pub fn model_over_https(&self) -> bool {
        matches!(self.model_source(), ModelSource::Remote(e) if e.base_url.starts_with("https://"))
    }

    pub fn model_source(&self) -> ModelSource {
        let model = &self.model;
        if model.api_key.is_none() && model.base_url.is_none() {
            return ModelSource::Scripted {
                faults: self.scripted.faults.clone(),
                delay: self.scripted.delay,
            };
        }
        ModelSource::Remote(ModelEndpoint {
            base_url: model
                .base_url
                .clone()
                .unwrap_or_else(|| OPENAI_BASE_URL.to_owned()),
            api_key: model.api_key.clone(),
            model: model.name.clone(),
            h2c: model.h2c,
            reasoning_effort: model.reasoning_effort,
            wire: model.wire_api,
        })
    }
}
