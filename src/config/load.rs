//! Reading the settings: defaults, then the config file, then the environment, then the
//! command line.

use std::path::{Path, PathBuf};

use super::table::SETTINGS;
use super::{ConfigError, DEFAULT_CONFIG, SettingError, Settings};

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
            if key == super::fallbacks::FILE_KEY {
                self.apply_fallbacks(value)?;
                continue;
            }
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
}
