//! What is wrong with the settings: the errors of reading them (`load.rs`), of one value
//! (`table.rs`, `fallbacks.rs`) and of their combination (`mod.rs`).

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
