//! The model endpoints after the primary: one by environment (`OPENAI_FALLBACK_*`), then
//! any listed in the config file, in order, as `model_fallbacks`:
//!
//! ```toml
//! model_fallbacks = [
//!   { base_url = "http://10.0.0.7:8000/v1", model = "qwen2.5-7b-instruct" },
//!   { base_url = "https://api.example.com/v1", model = "m", api_key = "sk-...", reasoning_effort = "none", wire_api = "responses" },
//! ]
//! ```

use super::{ConfigError, SettingError, Settings};
use crate::model::{ModelEndpoint, ReasoningEffort, WireApi};
use crate::secret::Secret;

/// The file key; it has no environment variable (`OPENAI_FALLBACK_*` is the one by
/// environment).
pub const FILE_KEY: &str = "model_fallbacks";

impl Settings {
    /// The fallbacks, in the order they are asked. Each speaks HTTP/1.1 or negotiates
    /// HTTP/2 by ALPN: `CHECKOUT_MODEL_H2C` is the primary's.
    pub fn fallback_endpoints(&self) -> Vec<ModelEndpoint> {
        let model = &self.model;
        let by_env = model
            .fallback_base_url
            .as_ref()
            .map(|base_url| ModelEndpoint {
                base_url: base_url.clone(),
                api_key: model.fallback_api_key.clone(),
                model: model
                    .fallback_model
                    .clone()
                    .unwrap_or_else(|| model.name.clone()),
                h2c: false,
                reasoning_effort: model.fallback_reasoning_effort.or(model.reasoning_effort),
                wire: model.fallback_wire_api.unwrap_or(model.wire_api),
            });
        by_env
            .into_iter()
            .chain(model.file_fallbacks.iter().cloned())
            .collect()
    }

    /// A fallback's model or key without its base URL is a mistake, not a default.
    pub(super) fn check_fallbacks(&self) -> Result<(), ConfigError> {
        let model = &self.model;
        if model.fallback_base_url.is_none()
            && (model.fallback_model.is_some()
                || model.fallback_api_key.is_some()
                || model.fallback_reasoning_effort.is_some()
                || model.fallback_wire_api.is_some())
        {
            return Err(ConfigError::Combination(
                "OPENAI_FALLBACK_MODEL, OPENAI_FALLBACK_API_KEY, OPENAI_FALLBACK_REASONING_EFFORT and OPENAI_FALLBACK_WIRE_API name a fallback endpoint, but OPENAI_FALLBACK_BASE_URL is not set".into(),
            ));
        }
        Ok(())
    }

    pub(super) fn apply_fallbacks(&mut self, value: toml::Value) -> Result<(), ConfigError> {
        let invalid = |message: String| SettingError {
            env: "(config file only)",
            key: FILE_KEY,
            message,
        };
        let toml::Value::Array(items) = value else {
            return Err(invalid(format!("expected a list of endpoints, got {value}")).into());
        };
        let mut endpoints = Vec::new();
        for item in items {
            let text = |field: &str| item.get(field).and_then(toml::Value::as_str);
            let known = [
                "base_url",
                "model",
                "api_key",
                "reasoning_effort",
                "wire_api",
            ];
            let unknown = item
                .as_table()
                .and_then(|t| t.keys().find(|k| !known.contains(&k.as_str())).cloned());
            let (Some(base_url), Some(model), None) = (text("base_url"), text("model"), unknown)
            else {
                return Err(invalid(format!(
                    "each endpoint is {{ base_url = \"http(s)://...\", model = \"...\" }} with an optional api_key, reasoning_effort and wire_api, got {item}"
                ))
                .into());
            };
            if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
                return Err(
                    invalid(format!("{base_url:?} is not an http:// or https:// URL")).into(),
                );
            }
            let reasoning_effort = match item.get("reasoning_effort") {
                None => None,
                Some(toml::Value::String(effort)) => ReasoningEffort::parse(effort)
                    .map_err(|e| invalid(format!("reasoning_effort: {e}")))?,
                Some(other) => {
                    return Err(invalid(format!(
                        "reasoning_effort: expected a string, got {other}"
                    ))
                    .into());
                }
            };
            let wire = match item.get("wire_api") {
                None => WireApi::Chat,
                Some(toml::Value::String(wire)) => {
                    WireApi::parse(wire).map_err(|e| invalid(format!("wire_api: {e}")))?
                }
                Some(other) => {
                    return Err(invalid(format!("wire_api: expected a string, got {other}")).into());
                }
            };
            endpoints.push(ModelEndpoint {
                base_url: base_url.trim_end_matches('/').to_owned(),
                api_key: text("api_key").map(Secret::new),
                model: model.to_owned(),
                h2c: false,
                reasoning_effort,
                wire,
            });
        }
        self.model.file_fallbacks = endpoints;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::load_from;
    use super::*;

    /// The settings from a config file of `file` and the environment `env`.
    fn load(file: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkout.toml");
        std::fs::write(&path, file).unwrap();
        load_from(path, env)
    }

    #[test]
    fn the_env_fallback_comes_first_then_the_files_in_order() {
        let file = r#"
            openai_model = "main"
            model_fallbacks = [
              { base_url = "http://b:1/v1/", model = "b" },
              { base_url = "https://c/v1", model = "c", api_key = "sk-c" },
            ]
            breaker_window = 10
        "#;
        let env = [
            ("OPENAI_FALLBACK_BASE_URL", "http://a:1/v1"),
            ("CHECKOUT_BREAKER_OPEN_MS", "250"),
        ];
        let s = load(file, &env).unwrap();
        let endpoints = s.fallback_endpoints();
        let shown: Vec<String> = endpoints.iter().map(ModelEndpoint::name).collect();
        assert_eq!(
            shown,
            ["main@http://a:1/v1", "b@http://b:1/v1", "c@https://c/v1"]
        );
        assert!(
            endpoints[0].api_key.is_none(),
            "the primary's key is not sent elsewhere"
        );
        assert_eq!(endpoints[2].api_key.as_ref().unwrap().expose(), "sk-c");
        assert_eq!(s.model.breaker.window, 10);
        assert_eq!(s.model.breaker.failure_percent, 100);
        assert_eq!(s.model.breaker.open, Duration::from_millis(250));
    }

    #[test]
    fn a_file_fallback_has_its_own_reasoning_effort_or_none() {
        let file = r#"
            openai_reasoning_effort = "low"
            model_fallbacks = [
              { base_url = "http://b/v1", model = "b", reasoning_effort = "none" },
              { base_url = "http://c/v1", model = "c" },
            ]
        "#;
        let s = load(file, &[("OPENAI_BASE_URL", "http://a/v1")]).unwrap();
        let efforts: Vec<_> = s
            .fallback_endpoints()
            .iter()
            .map(|e| e.reasoning_effort)
            .collect();
        assert_eq!(efforts, [Some(ReasoningEffort::None), None]);
        let err = load(
            r#"model_fallbacks = [{ base_url = "http://b", model = "b", reasoning_effort = "lots" }]"#,
            &[],
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting (config file only) (model_fallbacks in the config file): reasoning_effort: \"lots\" is not one of none, minimal, low, medium, high, xhigh"
        );
    }

    #[test]
    fn each_fallback_speaks_its_own_wire() {
        let file = r#"
            model_fallbacks = [
              { base_url = "http://b/v1", model = "b", wire_api = "responses" },
              { base_url = "http://c/v1", model = "c" },
            ]
        "#;
        let env = [
            ("OPENAI_BASE_URL", "http://a/v1"),
            ("OPENAI_WIRE_API", "responses"),
            ("OPENAI_FALLBACK_BASE_URL", "http://f/v1"),
            ("OPENAI_FALLBACK_WIRE_API", "chat"),
        ];
        let s = load(file, &env).unwrap();
        assert_eq!(s.model.wire_api, WireApi::Responses);
        let wires: Vec<_> = s.fallback_endpoints().iter().map(|e| e.wire).collect();
        assert_eq!(wires, [WireApi::Chat, WireApi::Responses, WireApi::Chat]);
        let s = load("", &env[..3]).unwrap();
        assert_eq!(
            s.fallback_endpoints()[0].wire,
            WireApi::Responses,
            "the env fallback's defaults to the primary's"
        );
        let err = load("", &[("OPENAI_WIRE_API", "completions")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting OPENAI_WIRE_API (openai_wire_api in the config file): \"completions\" is neither chat nor responses"
        );
        let err = load(
            r#"model_fallbacks = [{ base_url = "http://b", model = "b", wire_api = "soap" }]"#,
            &[],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("wire_api: \"soap\" is neither chat nor responses"),
            "{err}"
        );
    }

    #[test]
    fn a_fallback_without_its_url_or_with_an_unknown_field_is_refused() {
        let err = load("", &[("OPENAI_FALLBACK_MODEL", "m")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("OPENAI_FALLBACK_BASE_URL is not set"),
            "{err}"
        );
        let err = load(
            r#"model_fallbacks = [{ base_url = "http://b", model = "b", key = "k" }]"#,
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("model_fallbacks"), "{err}");
        let err = load(
            r#"model_fallbacks = [{ base_url = "b", model = "b" }]"#,
            &[],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("not an http:// or https:// URL"),
            "{err}"
        );
    }
}
