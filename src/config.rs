//! Settings: defaults ← config file ← environment ← command line.
//!
//! Every setting has one file key and one environment variable (the table in
//! `SETTINGS`); a bad value is one error naming both, and the process exits with 2.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::assistant::LoopRetrySettings;
use crate::caller::AuthMode;
use crate::db::PoolSettings;
use crate::model::scripted::FaultRule;
use crate::model::{ModelEndpoint, RequestRetrySettings};
use crate::outbox::MailSettings;
use crate::payments::stripe::StripeSettings;
use crate::secret::Secret;

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
    pub request: RequestRetrySettings,
    /// The whole assistant loop: its timeout, retry and rounds.
    pub r#loop: LoopSettings,
    pub idempotency: IdempotencySettings,
    /// The built-in model, when no provider is configured.
    pub scripted: ScriptedSettings,
    /// The confirmation email: where it goes, from whom, how it is retried.
    pub mail: MailSettings,
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
    /// One request to the provider: its timeout and retries.
    pub timeout: Duration,
    pub max_retries: u32,
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

/// Which model, where; see [`Settings::provider`].
#[derive(Clone, Debug)]
pub struct ModelSettings {
    pub base_url: Option<String>,
    pub api_key: Option<Secret>,
    pub name: String,
    pub h2c: bool,
}

#[derive(Clone, Debug)]
pub struct LoopSettings {
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

#[derive(Clone, Debug)]
pub struct ScriptedSettings {
    pub faults: Vec<FaultRule>,
    pub delay: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Which model the service talks to.
#[derive(Clone, Debug)]
pub enum Provider {
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
            },
            request: RequestRetrySettings {
                timeout: Duration::from_millis(10_000),
                max_retries: 2,
                backoff_min: Duration::from_millis(200),
                backoff_max: Duration::from_millis(2_000),
                retry_after_max: Duration::from_millis(5_000),
                budget_percent: 20,
                budget_min_per_sec: 10,
            },
            r#loop: LoopSettings {
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
            log_format: LogFormat::Text,
        }
    }
}

/// A setting that cannot be used, named by its environment variable and file key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting {env} ({key} in the config file): {message}")]
pub struct SettingError {
    pub env: &'static str,
    pub key: &'static str,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Setting(#[from] SettingError),
    #[error("cannot read config file {path}: {message}")]
    File { path: String, message: String },
    #[error("config file {path}: unknown setting {key:?}")]
    UnknownKey { path: String, key: String },
    #[error("invalid settings: {0}")]
    Combination(String),
}

type Setter = fn(&mut Settings, &str) -> Result<(), String>;

/// Every setting, one line each, in the sections of [`Settings`]: file key, environment
/// variable, where the parsed value goes. The names are the operator contract.
#[rustfmt::skip]
pub const SETTINGS: &[(&str, &str, Setter)] = &[
    ("listen", "CHECKOUT_LISTEN", |s, v| put(&mut s.server.listen, address(v))),
    ("auth", "CHECKOUT_AUTH", |s, v| put(&mut s.server.auth, AuthMode::parse(v))),
    ("server_timeout_ms", "CHECKOUT_SERVER_TIMEOUT_MS", |s, v| put(&mut s.server.timeout, millis(v, 1))),
    ("body_limit_bytes", "CHECKOUT_BODY_LIMIT_BYTES", |s, v| put(&mut s.server.body_limit_bytes, number(v, 64, 1 << 20))),
    ("max_amount", "CHECKOUT_MAX_AMOUNT", |s, v| put(&mut s.payments.max_amount, number(v, 1, 1_000_000_000_000))),
    ("payment_provider", "CHECKOUT_PAYMENT_PROVIDER", |s, v| put(&mut s.payments.provider, PaymentProvider::parse(v))),
    ("stripe_base_url", "STRIPE_BASE_URL", |s, v| put(&mut s.payments.stripe_base_url, http_url(v))),
    ("stripe_api_key", "STRIPE_API_KEY", |s, v| put(&mut s.payments.stripe_api_key, Ok((!v.is_empty()).then(|| Secret::new(v))))),
    ("provider_key_retention_secs", "CHECKOUT_PROVIDER_KEY_RETENTION_SECS", |s, v| put(&mut s.payments.key_retention, number(v, 1, 30 * 24 * 3600).map(Duration::from_secs))),
    ("provider_timeout_ms", "CHECKOUT_PROVIDER_TIMEOUT_MS", |s, v| put(&mut s.payments.timeout, millis(v, 1))),
    ("provider_max_retries", "CHECKOUT_PROVIDER_MAX_RETRIES", |s, v| put(&mut s.payments.max_retries, number(v, 0, 10))),
    ("database_url", "DATABASE_URL", |s, v| put(&mut s.database.url, database_url(v))),
    ("db_max_connections", "CHECKOUT_DB_MAX_CONNECTIONS", |s, v| put(&mut s.database.pool.max_connections, number(v, 1, 1000))),
    ("db_acquire_timeout_ms", "CHECKOUT_DB_ACQUIRE_TIMEOUT_MS", |s, v| put(&mut s.database.pool.acquire_timeout, millis(v, 1))),
    ("openai_base_url", "OPENAI_BASE_URL", |s, v| put(&mut s.model.base_url, http_url(v).map(Some))),
    ("openai_api_key", "OPENAI_API_KEY", |s, v| put(&mut s.model.api_key, Ok((!v.is_empty()).then(|| Secret::new(v))))),
    ("openai_model", "OPENAI_MODEL", |s, v| put(&mut s.model.name, not_empty(v))),
    ("model_h2c", "CHECKOUT_MODEL_H2C", |s, v| put(&mut s.model.h2c, boolean(v))),
    ("request_timeout_ms", "CHECKOUT_REQUEST_TIMEOUT_MS", |s, v| put(&mut s.request.timeout, millis(v, 1))),
    ("request_max_retries", "CHECKOUT_REQUEST_MAX_RETRIES", |s, v| put(&mut s.request.max_retries, number(v, 0, 10))),
    ("request_backoff_ms", "CHECKOUT_REQUEST_BACKOFF_MS", |s, v| put(&mut s.request.backoff_min, millis(v, 1))),
    ("request_backoff_max_ms", "CHECKOUT_REQUEST_BACKOFF_MAX_MS", |s, v| put(&mut s.request.backoff_max, millis(v, 1))),
    ("retry_after_max_ms", "CHECKOUT_RETRY_AFTER_MAX_MS", |s, v| put(&mut s.request.retry_after_max, millis(v, 0))),
    ("retry_budget_percent", "CHECKOUT_RETRY_BUDGET_PERCENT", |s, v| put(&mut s.request.budget_percent, number(v, 0, 1000))),
    ("retry_budget_min_per_sec", "CHECKOUT_RETRY_BUDGET_MIN_PER_SEC", |s, v| put(&mut s.request.budget_min_per_sec, number(v, 0, 1_000_000))),
    ("loop_timeout_ms", "CHECKOUT_LOOP_TIMEOUT_MS", |s, v| put(&mut s.r#loop.retry.timeout, millis(v, 1))),
    ("loop_max_retries", "CHECKOUT_LOOP_MAX_RETRIES", |s, v| put(&mut s.r#loop.retry.max_retries, number(v, 0, 10))),
    ("loop_backoff_ms", "CHECKOUT_LOOP_BACKOFF_MS", |s, v| put(&mut s.r#loop.retry.backoff_min, millis(v, 1))),
    ("loop_backoff_max_ms", "CHECKOUT_LOOP_BACKOFF_MAX_MS", |s, v| put(&mut s.r#loop.retry.backoff_max, millis(v, 1))),
    ("max_rounds", "CHECKOUT_MAX_ROUNDS", |s, v| put(&mut s.r#loop.max_rounds, number(v, 1, 100))),
    ("max_nudges", "CHECKOUT_MAX_NUDGES", |s, v| put(&mut s.r#loop.max_nudges, number(v, 0, 10))),
    ("journal", "CHECKOUT_JOURNAL", |s, v| put(&mut s.r#loop.journal, boolean(v))),
    ("idempotency_ttl_secs", "CHECKOUT_IDEMPOTENCY_TTL_SECS", |s, v| put(&mut s.idempotency.ttl, number(v, 1, 365 * 24 * 3600).map(Duration::from_secs))),
    ("idempotency_lease_ms", "CHECKOUT_IDEMPOTENCY_LEASE_MS", |s, v| put(&mut s.idempotency.lease, millis(v, 100))),
    ("recovery", "CHECKOUT_RECOVERY", |s, v| put(&mut s.idempotency.recovery, boolean(v))),
    ("recovery_max_attempts", "CHECKOUT_RECOVERY_MAX_ATTEMPTS", |s, v| put(&mut s.idempotency.recovery_max_attempts, number(v, 1, 100))),
    ("scripted_faults", "CHECKOUT_SCRIPTED_FAULTS", |s, v| put(&mut s.scripted.faults, FaultRule::parse_plan(v))),
    ("scripted_delay_ms", "CHECKOUT_SCRIPTED_DELAY_MS", |s, v| put(&mut s.scripted.delay, millis(v, 0))),
    ("smtp_url", "CHECKOUT_SMTP_URL", |s, v| put(&mut s.mail.smtp_url, smtp_url(v))),
    ("mail_dir", "CHECKOUT_MAIL_DIR", |s, v| put(&mut s.mail.dir, not_empty(v).map(PathBuf::from))),
    ("mail_from", "CHECKOUT_MAIL_FROM", |s, v| put(&mut s.mail.from, v.parse().map_err(|e| format!("{v:?} is not a sender such as checkout@example.com or \"Shop <shop@example.com>\": {e}")))),
    ("mail_lease_ms", "CHECKOUT_MAIL_LEASE_MS", |s, v| put(&mut s.mail.lease, millis(v, 100))),
    ("mail_max_attempts", "CHECKOUT_MAIL_MAX_ATTEMPTS", |s, v| put(&mut s.mail.max_attempts, number(v, 1, 100))),
    ("mail_backoff_ms", "CHECKOUT_MAIL_BACKOFF_MS", |s, v| put(&mut s.mail.backoff_min, millis(v, 1))),
    ("mail_backoff_max_ms", "CHECKOUT_MAIL_BACKOFF_MAX_MS", |s, v| put(&mut s.mail.backoff_max, millis(v, 1))),
    ("log_format", "CHECKOUT_LOG_FORMAT", |s, v| put(&mut s.log_format, log_format(v))),
];

fn put<T>(slot: &mut T, value: Result<T, String>) -> Result<(), String> {
    *slot = value?;
    Ok(())
}

fn address(v: &str) -> Result<SocketAddr, String> {
    v.parse()
        .map_err(|_| format!("{v:?} is not an address such as 127.0.0.1:8080"))
}

fn database_url(v: &str) -> Result<String, String> {
    if !(v.starts_with("sqlite:") || v.starts_with("postgres://") || v.starts_with("postgresql://"))
    {
        return Err("must start with sqlite:, postgres:// or postgresql://".into());
    }
    Ok(v.to_owned())
}

fn http_url(v: &str) -> Result<String, String> {
    if !(v.starts_with("http://") || v.starts_with("https://")) {
        return Err(format!("{v:?} is not an http:// or https:// URL"));
    }
    Ok(v.trim_end_matches('/').to_owned())
}

/// Empty means none: messages are written as files.
fn smtp_url(v: &str) -> Result<Option<Secret>, String> {
    if v.is_empty() {
        return Ok(None);
    }
    MailSettings::check_url(v)?;
    Ok(Some(Secret::new(v)))
}

fn not_empty(v: &str) -> Result<String, String> {
    if v.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(v.to_owned())
}

fn boolean(v: &str) -> Result<bool, String> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{v:?} is neither true nor false")),
    }
}

fn log_format(v: &str) -> Result<LogFormat, String> {
    match v {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!("{v:?} is neither text nor json")),
    }
}

fn number<T>(text: &str, min: T, max: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let n: T = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    if n < min || n > max {
        return Err(format!("{n} is outside {min}..={max}"));
    }
    Ok(n)
}

fn millis(text: &str, min: u64) -> Result<Duration, String> {
    Ok(Duration::from_millis(number(
        text,
        min,
        24 * 60 * 60 * 1000,
    )?))
}

/// Where settings come from, besides the built-in defaults.
#[derive(Debug, Default)]
pub struct Sources {
    /// `--config PATH`; else `CHECKOUT_CONFIG`; else `config/default.toml` if it exists.
    pub config_path: Option<PathBuf>,
    /// The environment, as (name, value) pairs.
    pub env: Vec<(String, String)>,
    /// Command-line overrides, as (environment name, value) pairs.
    pub overrides: Vec<(&'static str, String)>,
}

impl Sources {
    /// The process's own environment.
    pub fn from_env() -> Self {
        Sources {
            env: std::env::vars().collect(),
            ..Sources::default()
        }
    }
}

impl Settings {
    /// Defaults, then the config file, then the environment, then the overrides.
    pub fn load(sources: &Sources) -> Result<Settings, ConfigError> {
        let mut settings = Settings::default();
        let env_path = sources
            .env
            .iter()
            .find(|(k, _)| k == "CHECKOUT_CONFIG")
            .map(|(_, v)| PathBuf::from(v));
        match sources.config_path.clone().or(env_path) {
            Some(path) => settings.apply_file(&path)?,
            None if Path::new(DEFAULT_CONFIG).exists() => {
                settings.apply_file(Path::new(DEFAULT_CONFIG))?
            }
            None => {}
        }
        for (env, key, set) in SETTINGS.iter().map(|(k, e, s)| (*e, *k, s)) {
            let value = sources
                .overrides
                .iter()
                .find(|(name, _)| *name == env)
                .map(|(_, v)| v.as_str())
                .or_else(|| {
                    sources
                        .env
                        .iter()
                        .find(|(k, _)| k == env)
                        .map(|(_, v)| v.as_str())
                });
            if let Some(value) = value {
                set(&mut settings, value).map_err(|message| SettingError { env, key, message })?;
            }
        }
        settings.check()?;
        Ok(settings)
    }

    fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::File {
                path: shown.clone(),
                message: e.message().to_owned(),
            })?;
        for (key, value) in table {
            let Some((key, env, set)) = SETTINGS.iter().find(|(k, _, _)| *k == key) else {
                return Err(ConfigError::UnknownKey { path: shown, key });
            };
            let text = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(SettingError {
                        env,
                        key,
                        message: format!(
                            "expected a string, a whole number or a boolean, got {other}"
                        ),
                    }
                    .into());
                }
            };
            set(self, &text).map_err(|message| SettingError { env, key, message })?;
        }
        Ok(())
    }

    /// Combinations that cannot work.
    fn check(&self) -> Result<(), ConfigError> {
        let ms = |d: Duration| d.as_millis();
        if self.r#loop.retry.timeout <= self.request.timeout {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_LOOP_TIMEOUT_MS ({}) must be longer than CHECKOUT_REQUEST_TIMEOUT_MS ({}): a loop that cannot outlast one model request can never finish a round",
                ms(self.r#loop.retry.timeout),
                ms(self.request.timeout)
            )));
        }
        let worst = self.loop_worst_case();
        if self.server.timeout < worst {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_SERVER_TIMEOUT_MS ({}) is shorter than the worst case of the loop layers inside it ({} = {} loop attempts x {} ms + backoff): the server would cut off a checkout its own retries still run",
                ms(self.server.timeout),
                ms(worst),
                self.r#loop.retry.max_retries + 1,
                ms(self.r#loop.retry.timeout)
            )));
        }
        if self.request.backoff_min > self.request.backoff_max {
            return Err(ConfigError::Combination(
                "CHECKOUT_REQUEST_BACKOFF_MS must not exceed CHECKOUT_REQUEST_BACKOFF_MAX_MS"
                    .into(),
            ));
        }
        if self.r#loop.retry.backoff_min > self.r#loop.retry.backoff_max {
            return Err(ConfigError::Combination(
                "CHECKOUT_LOOP_BACKOFF_MS must not exceed CHECKOUT_LOOP_BACKOFF_MAX_MS".into(),
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
        if let Provider::Remote(endpoint) = self.provider()
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
        let scripted_options = !self.scripted.faults.is_empty() || !self.scripted.delay.is_zero();
        if scripted_options && matches!(self.provider(), Provider::Remote(_)) {
            return Err(ConfigError::Combination(
                "CHECKOUT_SCRIPTED_FAULTS and CHECKOUT_SCRIPTED_DELAY_MS apply to the scripted model, but OPENAI_API_KEY or OPENAI_BASE_URL is set".into(),
            ));
        }
        Ok(())
    }

    /// The longest the loop layers can take: every attempt timing out, with the longest
    /// backoff between attempts.
    pub fn loop_worst_case(&self) -> Duration {
        let retry = &self.r#loop.retry;
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
            backoff_min: self.request.backoff_min,
            backoff_max: self.request.backoff_max,
            key_retention: payments.key_retention,
        })
    }

    pub fn provider(&self) -> Provider {
        let model = &self.model;
        if model.api_key.is_none() && model.base_url.is_none() {
            return Provider::Scripted {
                faults: self.scripted.faults.clone(),
                delay: self.scripted.delay,
            };
        }
        Provider::Remote(ModelEndpoint {
            base_url: model
                .base_url
                .clone()
                .unwrap_or_else(|| OPENAI_BASE_URL.to_owned()),
            api_key: model.api_key.clone(),
            model: model.name.clone(),
            h2c: model.h2c,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::load(&Sources {
            config_path: Some(PathBuf::from("config/default.toml")),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            overrides: vec![],
        })
    }

    #[test]
    fn the_shipped_file_gives_the_documented_defaults() {
        let s = load(&[]).unwrap();
        assert_eq!(s.server.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.database.url, "sqlite://checkout.db");
        assert_eq!(s.model.name, "gpt-4o-mini");
        assert_eq!(s.request.timeout, Duration::from_millis(10_000));
        assert_eq!((s.request.max_retries, s.r#loop.retry.max_retries), (2, 2));
        assert_eq!(s.r#loop.retry.timeout, Duration::from_millis(30_000));
        assert_eq!(s.r#loop.max_rounds, 10);
        assert!(matches!(s.provider(), Provider::Scripted { .. }));
    }

    #[test]
    fn every_setting_is_in_the_shipped_file() {
        let text = std::fs::read_to_string("config/default.toml").unwrap();
        for (key, env, _) in SETTINGS {
            assert!(
                text.contains(&format!("{key} =")) || text.contains(&format!("# {key} =")),
                "{key} missing"
            );
            assert!(text.contains(env), "{env} missing");
        }
    }

    #[test]
    fn env_overrides_the_file() {
        let s = load(&[("CHECKOUT_MAX_ROUNDS", "3"), ("OPENAI_API_KEY", "sk-1")]).unwrap();
        assert_eq!(s.r#loop.max_rounds, 3);
        match s.provider() {
            Provider::Remote(endpoint) => assert_eq!(endpoint.base_url, OPENAI_BASE_URL),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_bad_value_names_the_setting() {
        let err = load(&[("CHECKOUT_LOOP_TIMEOUT_MS", "soon")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting CHECKOUT_LOOP_TIMEOUT_MS (loop_timeout_ms in the config file): \"soon\" is not a whole number"
        );
    }

    #[test]
    fn callers_default_to_auto_and_a_bad_mode_names_checkout_auth() {
        assert_eq!(load(&[]).unwrap().server.auth, AuthMode::Auto);
        let s = load(&[("CHECKOUT_AUTH", "required")]).unwrap();
        assert_eq!(s.server.auth, AuthMode::Required);
        let err = load(&[("CHECKOUT_AUTH", "maybe")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting CHECKOUT_AUTH (auth in the config file): \"maybe\" is none of auto, required, off"
        );
    }

    #[test]
    fn the_payment_provider_is_the_ledger_unless_stripe_is_set_with_its_key() {
        let s = load(&[]).unwrap();
        assert_eq!(s.payments.provider, PaymentProvider::Ledger);
        assert!(s.stripe().is_none());
        let err = load(&[("CHECKOUT_PAYMENT_PROVIDER", "stripe")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting STRIPE_API_KEY (stripe_api_key in the config file): is required with CHECKOUT_PAYMENT_PROVIDER=stripe (a test-mode key sk_test_… to try it)"
        );
        let s = load(&[
            ("CHECKOUT_PAYMENT_PROVIDER", "stripe"),
            ("STRIPE_API_KEY", "sk_test_123"),
        ])
        .unwrap();
        let stripe = s.stripe().unwrap();
        assert_eq!(stripe.base_url, "https://api.stripe.com");
        assert_eq!(stripe.key_retention, Duration::from_secs(24 * 3600));
        assert!(!format!("{stripe:?}").contains("sk_test_123"));
        let err = load(&[("CHECKOUT_PAYMENT_PROVIDER", "paypal")]).unwrap_err();
        assert!(
            err.to_string().contains("CHECKOUT_PAYMENT_PROVIDER"),
            "{err}"
        );
    }

    #[test]
    fn settings_that_cannot_work_are_refused() {
        let err = load(&[
            ("CHECKOUT_LOOP_TIMEOUT_MS", "5000"),
            ("CHECKOUT_REQUEST_TIMEOUT_MS", "5000"),
        ])
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("must be longer than CHECKOUT_REQUEST_TIMEOUT_MS"),
            "{err}"
        );
        let err = load(&[("CHECKOUT_MODEL_H2C", "true"), ("OPENAI_API_KEY", "sk-1")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("CHECKOUT_MODEL_H2C applies to an http:// model URL"),
            "{err}"
        );
        let s = load(&[
            ("CHECKOUT_MODEL_H2C", "true"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
        ])
        .unwrap();
        assert!(s.model.h2c);
        let err = load(&[("CHECKOUT_SERVER_TIMEOUT_MS", "60000")]).unwrap_err();
        assert!(
            err.to_string().contains("shorter than the worst case"),
            "{err}"
        );
    }
}
