//! Every setting's file key and environment variable, and how its value is read.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{AuthMode, PaymentProvider, Settings};
use crate::model::scripted::FaultRule;
use crate::model::{ReasoningEffort, WireApi};
use crate::outbox::MailSettings;
use crate::payments::PerCurrency;
use crate::secret::Secret;
use crate::telemetry::LogFormat;
use crate::webhooks::{SigningKeys, WebhookSettings};

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
    ("provider_backoff_ms", "CHECKOUT_PROVIDER_BACKOFF_MS", |s, v| put(&mut s.payments.backoff_min, millis(v, 1))),
    ("provider_backoff_max_ms", "CHECKOUT_PROVIDER_BACKOFF_MAX_MS", |s, v| put(&mut s.payments.backoff_max, millis(v, 1))),
    ("approval_above", "CHECKOUT_APPROVAL_ABOVE", |s, v| put(&mut s.payments.approval_above, PerCurrency::parse(v))),
    ("approval_ttl_secs", "CHECKOUT_APPROVAL_TTL_SECS", |s, v| put(&mut s.payments.approval_ttl, number(v, 1, 365 * 24 * 3600).map(Duration::from_secs))),
    ("budget_per_day", "CHECKOUT_BUDGET_PER_DAY", |s, v| put(&mut s.payments.budget_per_day, PerCurrency::parse(v))),
    ("database_url", "DATABASE_URL", |s, v| put(&mut s.database.url, database_url(v))),
    ("db_max_connections", "CHECKOUT_DB_MAX_CONNECTIONS", |s, v| put(&mut s.database.pool.max_connections, number(v, 1, 1000))),
    ("db_acquire_timeout_ms", "CHECKOUT_DB_ACQUIRE_TIMEOUT_MS", |s, v| put(&mut s.database.pool.acquire_timeout, millis(v, 1))),
    ("openai_base_url", "OPENAI_BASE_URL", |s, v| put(&mut s.model.base_url, http_url(v).map(Some))),
    ("openai_api_key", "OPENAI_API_KEY", |s, v| put(&mut s.model.api_key, Ok((!v.is_empty()).then(|| Secret::new(v))))),
    ("openai_model", "OPENAI_MODEL", |s, v| put(&mut s.model.name, not_empty(v))),
    ("openai_reasoning_effort", "OPENAI_REASONING_EFFORT", |s, v| put(&mut s.model.reasoning_effort, ReasoningEffort::parse(v))),
    ("openai_wire_api", "OPENAI_WIRE_API", |s, v| put(&mut s.model.wire_api, WireApi::parse(v))),
    ("model_h2c", "CHECKOUT_MODEL_H2C", |s, v| put(&mut s.model.h2c, boolean(v))),
    ("openai_fallback_base_url", "OPENAI_FALLBACK_BASE_URL", |s, v| put(&mut s.model.fallback_base_url, http_url(v).map(Some))),
    ("openai_fallback_api_key", "OPENAI_FALLBACK_API_KEY", |s, v| put(&mut s.model.fallback_api_key, Ok((!v.is_empty()).then(|| Secret::new(v))))),
    ("openai_fallback_model", "OPENAI_FALLBACK_MODEL", |s, v| put(&mut s.model.fallback_model, not_empty(v).map(Some))),
    ("openai_fallback_reasoning_effort", "OPENAI_FALLBACK_REASONING_EFFORT", |s, v| put(&mut s.model.fallback_reasoning_effort, ReasoningEffort::parse(v))),
    ("openai_fallback_wire_api", "OPENAI_FALLBACK_WIRE_API", |s, v| put(&mut s.model.fallback_wire_api, WireApi::parse(v).map(Some))),
    ("breaker_window", "CHECKOUT_BREAKER_WINDOW", |s, v| put(&mut s.model.breaker.window, number(v, 1, 10_000))),
    ("breaker_failure_percent", "CHECKOUT_BREAKER_FAILURE_PERCENT", |s, v| put(&mut s.model.breaker.failure_percent, number(v, 1, 100))),
    ("breaker_open_ms", "CHECKOUT_BREAKER_OPEN_MS", |s, v| put(&mut s.model.breaker.open, millis(v, 1))),
    ("model_max_answer_bytes", "CHECKOUT_MODEL_MAX_ANSWER_BYTES", |s, v| put(&mut s.model.transport.max_answer_bytes, number(v, 1024, 1 << 30))),
    ("model_keepalive_ms", "CHECKOUT_MODEL_KEEPALIVE_MS", |s, v| put(&mut s.model.transport.keep_alive, millis(v, 1))),
    ("model_keepalive_timeout_ms", "CHECKOUT_MODEL_KEEPALIVE_TIMEOUT_MS", |s, v| put(&mut s.model.transport.keep_alive_timeout, millis(v, 1))),
    ("model_connect_timeout_ms", "CHECKOUT_MODEL_CONNECT_TIMEOUT_MS", |s, v| put(&mut s.model.transport.connect_timeout, millis(v, 1))),
    ("request_timeout_ms", "CHECKOUT_REQUEST_TIMEOUT_MS", |s, v| put(&mut s.model_request.timeout, millis(v, 1))),
    ("request_max_retries", "CHECKOUT_REQUEST_MAX_RETRIES", |s, v| put(&mut s.model_request.max_retries, number(v, 0, 10))),
    ("request_backoff_ms", "CHECKOUT_REQUEST_BACKOFF_MS", |s, v| put(&mut s.model_request.backoff_min, millis(v, 1))),
    ("request_backoff_max_ms", "CHECKOUT_REQUEST_BACKOFF_MAX_MS", |s, v| put(&mut s.model_request.backoff_max, millis(v, 1))),
    ("retry_after_max_ms", "CHECKOUT_RETRY_AFTER_MAX_MS", |s, v| put(&mut s.model_request.retry_after_max, millis(v, 0))),
    ("retry_budget_percent", "CHECKOUT_RETRY_BUDGET_PERCENT", |s, v| put(&mut s.model_request.budget_percent, number(v, 0, 1000))),
    ("retry_budget_min_per_sec", "CHECKOUT_RETRY_BUDGET_MIN_PER_SEC", |s, v| put(&mut s.model_request.budget_min_per_sec, number(v, 0, 1_000_000))),
    ("loop_timeout_ms", "CHECKOUT_LOOP_TIMEOUT_MS", |s, v| put(&mut s.assistant.retry.timeout, millis(v, 1))),
    ("loop_max_retries", "CHECKOUT_LOOP_MAX_RETRIES", |s, v| put(&mut s.assistant.retry.max_retries, number(v, 0, 10))),
    ("loop_backoff_ms", "CHECKOUT_LOOP_BACKOFF_MS", |s, v| put(&mut s.assistant.retry.backoff_min, millis(v, 1))),
    ("loop_backoff_max_ms", "CHECKOUT_LOOP_BACKOFF_MAX_MS", |s, v| put(&mut s.assistant.retry.backoff_max, millis(v, 1))),
    ("max_rounds", "CHECKOUT_MAX_ROUNDS", |s, v| put(&mut s.assistant.max_rounds, number(v, 1, 100))),
    ("max_nudges", "CHECKOUT_MAX_NUDGES", |s, v| put(&mut s.assistant.max_nudges, number(v, 0, 10))),
    ("journal", "CHECKOUT_JOURNAL", |s, v| put(&mut s.assistant.journal, boolean(v))),
    ("idempotency_ttl_secs", "CHECKOUT_IDEMPOTENCY_TTL_SECS", |s, v| put(&mut s.idempotency.ttl, number(v, 1, 365 * 24 * 3600).map(Duration::from_secs))),
    ("idempotency_lease_ms", "CHECKOUT_IDEMPOTENCY_LEASE_MS", |s, v| put(&mut s.idempotency.lease, millis(v, 100))),
    ("recovery", "CHECKOUT_RECOVERY", |s, v| put(&mut s.idempotency.recovery, boolean(v))),
    ("recovery_max_attempts", "CHECKOUT_RECOVERY_MAX_ATTEMPTS", |s, v| put(&mut s.idempotency.recovery_max_attempts, number(v, 1, 100))),
    ("max_in_flight", "CHECKOUT_MAX_IN_FLIGHT", |s, v| put(&mut s.overload.max_in_flight, number(v, 1, 10_000_000))),
    ("rate_limit_per_sec", "CHECKOUT_RATE_LIMIT_PER_SEC", |s, v| put(&mut s.overload.rate_per_sec, number(v, 0, 1_000_000))),
    ("rate_limit_burst", "CHECKOUT_RATE_LIMIT_BURST", |s, v| put(&mut s.overload.rate_burst, number(v, 0, 1_000_000))),
    ("header_timeout_ms", "CHECKOUT_HEADER_TIMEOUT_MS", |s, v| put(&mut s.overload.header_timeout, millis(v, 100).and_then(at_most_30_s))),
    ("idle_timeout_ms", "CHECKOUT_IDLE_TIMEOUT_MS", |s, v| put(&mut s.overload.idle_timeout, millis(v, 100))),
    ("max_connections", "CHECKOUT_MAX_CONNECTIONS", |s, v| put(&mut s.overload.max_connections, number(v, 0, 10_000_000))),
    ("scripted_faults", "CHECKOUT_SCRIPTED_FAULTS", |s, v| put(&mut s.scripted.faults, FaultRule::parse_plan(v))),
    ("scripted_delay_ms", "CHECKOUT_SCRIPTED_DELAY_MS", |s, v| put(&mut s.scripted.delay, millis(v, 0))),
    ("smtp_url", "CHECKOUT_SMTP_URL", |s, v| put(&mut s.mail.smtp_url, smtp_url(v))),
    ("mail_dir", "CHECKOUT_MAIL_DIR", |s, v| put(&mut s.mail.dir, not_empty(v).map(PathBuf::from))),
    ("mail_from", "CHECKOUT_MAIL_FROM", |s, v| put(&mut s.mail.from, v.parse().map_err(|e| format!("{v:?} is not a sender such as checkout@example.com or \"Shop <shop@example.com>\": {e}")))),
    ("mail_lease_ms", "CHECKOUT_MAIL_LEASE_MS", |s, v| put(&mut s.mail.lease, millis(v, 100))),
    ("mail_max_attempts", "CHECKOUT_MAIL_MAX_ATTEMPTS", |s, v| put(&mut s.mail.max_attempts, number(v, 1, 100))),
    ("mail_backoff_ms", "CHECKOUT_MAIL_BACKOFF_MS", |s, v| put(&mut s.mail.backoff_min, millis(v, 1))),
    ("mail_backoff_max_ms", "CHECKOUT_MAIL_BACKOFF_MAX_MS", |s, v| put(&mut s.mail.backoff_max, millis(v, 1))),
    ("webhook_url", "CHECKOUT_WEBHOOK_URL", |s, v| put(&mut s.webhooks.url, if v.is_empty() { Ok(None) } else { http_url(v).map(Some) })),
    ("public_url", "CHECKOUT_PUBLIC_URL", |s, v| put(&mut s.webhooks.public_url, if v.is_empty() { Ok(None) } else { http_url(v).map(Some) })),
    ("webhook_secret", "CHECKOUT_WEBHOOK_SECRET", |s, v| put(&mut s.webhooks.secret, webhook_secret(v))),
    ("webhook_events", "CHECKOUT_WEBHOOK_EVENTS", |s, v| put(&mut s.webhooks.events, WebhookSettings::parse_events(v))),
    ("webhook_retry_schedule", "CHECKOUT_WEBHOOK_RETRY_SCHEDULE", |s, v| put(&mut s.webhooks.retry_schedule, WebhookSettings::parse_schedule(v))),
    ("webhook_timeout_ms", "CHECKOUT_WEBHOOK_TIMEOUT_MS", |s, v| put(&mut s.webhooks.timeout, millis(v, 100).and_then(at_most_30_s))),
    ("webhook_lease_ms", "CHECKOUT_WEBHOOK_LEASE_MS", |s, v| put(&mut s.webhooks.lease, millis(v, 100))),
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
    crate::db::check_url(v)?;
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

/// Empty means none; else `whsec_` + base64 of 24 to 64 bytes, or several such separated
/// by spaces or commas (a rotation), every one checked.
fn webhook_secret(v: &str) -> Result<Option<Secret>, String> {
    if v.is_empty() {
        return Ok(None);
    }
    let secret = Secret::new(v);
    SigningKeys::parse(&secret)?;
    Ok(Some(secret))
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

fn at_most_30_s(d: Duration) -> Result<Duration, String> {
    if d > Duration::from_secs(30) {
        return Err(format!(
            "{} ms is longer than 30000: a client that stalls its request head holds a connection that long",
            d.as_millis()
        ));
    }
    Ok(d)
}

fn millis(text: &str, min: u64) -> Result<Duration, String> {
    Ok(Duration::from_millis(number(
        text,
        min,
        24 * 60 * 60 * 1000,
    )?))
}
