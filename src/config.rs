//! Settings: defaults ← config file ← environment ← command line.
//!
//! Every setting has one file key and one environment variable (the table in
//! `SETTINGS`); a bad value is one error naming both, and the process exits with 2.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::assistant::LoopRetrySettings;
use crate::db::PoolSettings;
use crate::model::scripted::FaultRule;
use crate::model::{ModelEndpoint, RequestRetrySettings};
use crate::secret::Secret;

pub const DEFAULT_CONFIG: &str = "config/default.toml";
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    pub database_url: String,
    pub openai_base_url: Option<String>,
    pub openai_api_key: Option<Secret>,
    pub openai_model: String,
    pub model_h2c: bool,
    pub request_timeout: Duration,
    pub request_max_retries: u32,
    pub request_backoff: Duration,
    pub request_backoff_max: Duration,
    pub retry_after_max: Duration,
    pub retry_budget_percent: u32,
    pub retry_budget_min_per_sec: u32,
    pub loop_timeout: Duration,
    pub loop_max_retries: u32,
    pub loop_backoff: Duration,
    pub loop_backoff_max: Duration,
    pub max_rounds: u32,
    pub server_timeout: Duration,
    pub max_amount: u64,
    pub body_limit_bytes: usize,
    pub db_max_connections: u32,
    pub db_acquire_timeout: Duration,
    pub idempotency_ttl: Duration,
    pub idempotency_lease: Duration,
    pub log_format: LogFormat,
    pub scripted_faults: Vec<FaultRule>,
    pub scripted_delay: Duration,
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
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            database_url: "sqlite://checkout.db".into(),
            openai_base_url: None,
            openai_api_key: None,
            openai_model: "gpt-4o-mini".into(),
            model_h2c: false,
            request_timeout: Duration::from_millis(10_000),
            request_max_retries: 2,
            request_backoff: Duration::from_millis(200),
            request_backoff_max: Duration::from_millis(2_000),
            retry_after_max: Duration::from_millis(5_000),
            retry_budget_percent: 20,
            retry_budget_min_per_sec: 10,
            loop_timeout: Duration::from_millis(30_000),
            loop_max_retries: 2,
            loop_backoff: Duration::from_millis(100),
            loop_backoff_max: Duration::from_millis(1_000),
            max_rounds: 10,
            server_timeout: Duration::from_millis(100_000),
            max_amount: 1_000_000,
            body_limit_bytes: 16 * 1024,
            db_max_connections: 16,
            db_acquire_timeout: Duration::from_millis(2_000),
            idempotency_ttl: Duration::from_secs(24 * 60 * 60),
            idempotency_lease: Duration::from_millis(10_000),
            log_format: LogFormat::Text,
            scripted_faults: Vec::new(),
            scripted_delay: Duration::ZERO,
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

/// Every setting: file key, environment variable, how to read it.
pub const SETTINGS: &[(&str, &str, Setter)] = &[
    ("listen", "CHECKOUT_LISTEN", |s, v| {
        s.listen = v
            .parse()
            .map_err(|_| format!("{v:?} is not an address such as 127.0.0.1:8080"))?;
        Ok(())
    }),
    ("database_url", "DATABASE_URL", |s, v| {
        if !(v.starts_with("sqlite:")
            || v.starts_with("postgres://")
            || v.starts_with("postgresql://"))
        {
            return Err("must start with sqlite:, postgres:// or postgresql://".into());
        }
        s.database_url = v.to_owned();
        Ok(())
    }),
    ("openai_base_url", "OPENAI_BASE_URL", |s, v| {
        if !(v.starts_with("http://") || v.starts_with("https://")) {
            return Err(format!("{v:?} is not an http:// or https:// URL"));
        }
        s.openai_base_url = Some(v.trim_end_matches('/').to_owned());
        Ok(())
    }),
    ("openai_api_key", "OPENAI_API_KEY", |s, v| {
        s.openai_api_key = (!v.is_empty()).then(|| Secret::new(v));
        Ok(())
    }),
    ("openai_model", "OPENAI_MODEL", |s, v| {
        if v.is_empty() {
            return Err("must not be empty".into());
        }
        s.openai_model = v.to_owned();
        Ok(())
    }),
    ("model_h2c", "CHECKOUT_MODEL_H2C", |s, v| {
        s.model_h2c = match v {
            "true" => true,
            "false" => false,
            _ => return Err(format!("{v:?} is neither true nor false")),
        };
        Ok(())
    }),
    (
        "request_timeout_ms",
        "CHECKOUT_REQUEST_TIMEOUT_MS",
        |s, v| {
            s.request_timeout = millis(v, 1)?;
            Ok(())
        },
    ),
    (
        "request_max_retries",
        "CHECKOUT_REQUEST_MAX_RETRIES",
        |s, v| {
            s.request_max_retries = number(v, 0, 10)?;
            Ok(())
        },
    ),
    (
        "request_backoff_ms",
        "CHECKOUT_REQUEST_BACKOFF_MS",
        |s, v| {
            s.request_backoff = millis(v, 1)?;
            Ok(())
        },
    ),
    (
        "request_backoff_max_ms",
        "CHECKOUT_REQUEST_BACKOFF_MAX_MS",
        |s, v| {
            s.request_backoff_max = millis(v, 1)?;
            Ok(())
        },
    ),
    (
        "retry_after_max_ms",
        "CHECKOUT_RETRY_AFTER_MAX_MS",
        |s, v| {
            s.retry_after_max = millis(v, 0)?;
            Ok(())
        },
    ),
    (
        "retry_budget_percent",
        "CHECKOUT_RETRY_BUDGET_PERCENT",
        |s, v| {
            s.retry_budget_percent = number(v, 0, 1000)?;
            Ok(())
        },
    ),
    (
        "retry_budget_min_per_sec",
        "CHECKOUT_RETRY_BUDGET_MIN_PER_SEC",
        |s, v| {
            s.retry_budget_min_per_sec = number(v, 0, 1_000_000)?;
            Ok(())
        },
    ),
    ("loop_timeout_ms", "CHECKOUT_LOOP_TIMEOUT_MS", |s, v| {
        s.loop_timeout = millis(v, 1)?;
        Ok(())
    }),
    ("loop_max_retries", "CHECKOUT_LOOP_MAX_RETRIES", |s, v| {
        s.loop_max_retries = number(v, 0, 10)?;
        Ok(())
    }),
    ("loop_backoff_ms", "CHECKOUT_LOOP_BACKOFF_MS", |s, v| {
        s.loop_backoff = millis(v, 1)?;
        Ok(())
    }),
    (
        "loop_backoff_max_ms",
        "CHECKOUT_LOOP_BACKOFF_MAX_MS",
        |s, v| {
            s.loop_backoff_max = millis(v, 1)?;
            Ok(())
        },
    ),
    ("max_rounds", "CHECKOUT_MAX_ROUNDS", |s, v| {
        s.max_rounds = number(v, 1, 100)?;
        Ok(())
    }),
    ("server_timeout_ms", "CHECKOUT_SERVER_TIMEOUT_MS", |s, v| {
        s.server_timeout = millis(v, 1)?;
        Ok(())
    }),
    ("max_amount", "CHECKOUT_MAX_AMOUNT", |s, v| {
        s.max_amount = number(v, 1, 1_000_000_000_000)?;
        Ok(())
    }),
    ("body_limit_bytes", "CHECKOUT_BODY_LIMIT_BYTES", |s, v| {
        s.body_limit_bytes = number(v, 64, 1 << 20)?;
        Ok(())
    }),
    (
        "db_max_connections",
        "CHECKOUT_DB_MAX_CONNECTIONS",
        |s, v| {
            s.db_max_connections = number(v, 1, 1000)?;
            Ok(())
        },
    ),
    (
        "db_acquire_timeout_ms",
        "CHECKOUT_DB_ACQUIRE_TIMEOUT_MS",
        |s, v| {
            s.db_acquire_timeout = millis(v, 1)?;
            Ok(())
        },
    ),
    (
        "idempotency_ttl_secs",
        "CHECKOUT_IDEMPOTENCY_TTL_SECS",
        |s, v| {
            s.idempotency_ttl = Duration::from_secs(number(v, 1, 365 * 24 * 3600)?);
            Ok(())
        },
    ),
    (
        "idempotency_lease_ms",
        "CHECKOUT_IDEMPOTENCY_LEASE_MS",
        |s, v| {
            s.idempotency_lease = millis(v, 100)?;
            Ok(())
        },
    ),
    ("log_format", "CHECKOUT_LOG_FORMAT", |s, v| {
        s.log_format = match v {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            _ => return Err(format!("{v:?} is neither text nor json")),
        };
        Ok(())
    }),
    ("scripted_faults", "CHECKOUT_SCRIPTED_FAULTS", |s, v| {
        s.scripted_faults = FaultRule::parse_plan(v)?;
        Ok(())
    }),
    ("scripted_delay_ms", "CHECKOUT_SCRIPTED_DELAY_MS", |s, v| {
        s.scripted_delay = millis(v, 0)?;
        Ok(())
    }),
];

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
        if self.loop_timeout <= self.request_timeout {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_LOOP_TIMEOUT_MS ({}) must be longer than CHECKOUT_REQUEST_TIMEOUT_MS ({}): a loop that cannot outlast one model request can never finish a round",
                ms(self.loop_timeout),
                ms(self.request_timeout)
            )));
        }
        let worst = self.loop_worst_case();
        if self.server_timeout < worst {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_SERVER_TIMEOUT_MS ({}) is shorter than the worst case of the loop layers inside it ({} = {} loop attempts x {} ms + backoff): the server would cut off a checkout its own retries still run",
                ms(self.server_timeout),
                ms(worst),
                self.loop_max_retries + 1,
                ms(self.loop_timeout)
            )));
        }
        if self.request_backoff > self.request_backoff_max {
            return Err(ConfigError::Combination(
                "CHECKOUT_REQUEST_BACKOFF_MS must not exceed CHECKOUT_REQUEST_BACKOFF_MAX_MS"
                    .into(),
            ));
        }
        if self.loop_backoff > self.loop_backoff_max {
            return Err(ConfigError::Combination(
                "CHECKOUT_LOOP_BACKOFF_MS must not exceed CHECKOUT_LOOP_BACKOFF_MAX_MS".into(),
            ));
        }
        if self.idempotency_ttl <= self.server_timeout {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_IDEMPOTENCY_TTL_SECS ({} s) must be longer than CHECKOUT_SERVER_TIMEOUT_MS ({} ms): a key must outlive the request that holds it",
                self.idempotency_ttl.as_secs(),
                ms(self.server_timeout)
            )));
        }
        if let Provider::Remote(endpoint) = self.provider()
            && self.model_h2c
            && !endpoint.base_url.starts_with("http://")
        {
            return Err(ConfigError::Combination(format!(
                "CHECKOUT_MODEL_H2C applies to an http:// model URL, not {}: over https the provider and the client agree on HTTP/2 themselves (ALPN)",
                endpoint.base_url
            )));
        }
        let scripted_options = !self.scripted_faults.is_empty() || !self.scripted_delay.is_zero();
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
        self.loop_timeout * (self.loop_max_retries + 1)
            + self.loop_backoff_max * self.loop_max_retries
    }

    pub fn provider(&self) -> Provider {
        if self.openai_api_key.is_none() && self.openai_base_url.is_none() {
            return Provider::Scripted {
                faults: self.scripted_faults.clone(),
                delay: self.scripted_delay,
            };
        }
        Provider::Remote(ModelEndpoint {
            base_url: self
                .openai_base_url
                .clone()
                .unwrap_or_else(|| OPENAI_BASE_URL.to_owned()),
            api_key: self.openai_api_key.clone(),
            model: self.openai_model.clone(),
            h2c: self.model_h2c,
        })
    }

    pub fn request_retry(&self) -> RequestRetrySettings {
        RequestRetrySettings {
            max_retries: self.request_max_retries,
            timeout: self.request_timeout,
            backoff_min: self.request_backoff,
            backoff_max: self.request_backoff_max,
            retry_after_max: self.retry_after_max,
            budget_percent: self.retry_budget_percent,
            budget_min_per_sec: self.retry_budget_min_per_sec,
        }
    }

    pub fn loop_retry(&self) -> LoopRetrySettings {
        LoopRetrySettings {
            max_retries: self.loop_max_retries,
            timeout: self.loop_timeout,
            backoff_min: self.loop_backoff,
            backoff_max: self.loop_backoff_max,
        }
    }

    pub fn pool(&self) -> PoolSettings {
        PoolSettings {
            max_connections: self.db_max_connections,
            acquire_timeout: self.db_acquire_timeout,
        }
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
        assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.database_url, "sqlite://checkout.db");
        assert_eq!(s.openai_model, "gpt-4o-mini");
        assert_eq!(s.request_timeout, Duration::from_millis(10_000));
        assert_eq!((s.request_max_retries, s.loop_max_retries), (2, 2));
        assert_eq!(s.loop_timeout, Duration::from_millis(30_000));
        assert_eq!(s.max_rounds, 10);
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
        assert_eq!(s.max_rounds, 3);
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
        assert!(s.model_h2c);
        let err = load(&[("CHECKOUT_SERVER_TIMEOUT_MS", "60000")]).unwrap_err();
        assert!(
            err.to_string().contains("shorter than the worst case"),
            "{err}"
        );
    }
}
