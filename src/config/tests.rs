use super::*;

fn load(env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    load_from(PathBuf::from("config/default.toml"), env)
}

/// The settings from the file at `path` and the environment `env`.
pub(super) fn load_from(path: PathBuf, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    Settings::load(&Sources {
        config_path: Some(path),
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
    assert_eq!(s.model_request.timeout, Duration::from_millis(10_000));
    assert_eq!(
        (s.model_request.max_retries, s.assistant.retry.max_retries),
        (2, 2)
    );
    assert_eq!(s.assistant.retry.timeout, Duration::from_millis(30_000));
    assert_eq!(s.assistant.max_rounds, 10);
    assert!(matches!(s.model_source(), ModelSource::Scripted { .. }));
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
    assert_eq!(s.assistant.max_rounds, 3);
    match s.model_source() {
        ModelSource::Remote(endpoint) => assert_eq!(endpoint.base_url, OPENAI_BASE_URL),
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

#[test]
fn a_reasoning_effort_is_sent_per_endpoint_and_a_bad_one_names_its_setting() {
    let s = load(&[]).unwrap();
    assert_eq!(s.model.reasoning_effort, None, "unset sends nothing");
    let s = load(&[
        ("OPENAI_BASE_URL", "http://a/v1"),
        ("OPENAI_REASONING_EFFORT", "none"),
        ("OPENAI_FALLBACK_BASE_URL", "http://b/v1"),
    ])
    .unwrap();
    let ModelSource::Remote(primary) = s.model_source() else {
        panic!("a remote model")
    };
    assert_eq!(primary.reasoning_effort, Some(ReasoningEffort::None));
    assert_eq!(
        s.fallback_endpoints()[0].reasoning_effort,
        Some(ReasoningEffort::None),
        "the fallback's defaults to the primary's, as its model does"
    );
    let s = load(&[
        ("OPENAI_REASONING_EFFORT", "none"),
        ("OPENAI_FALLBACK_BASE_URL", "http://b/v1"),
        ("OPENAI_FALLBACK_REASONING_EFFORT", "xhigh"),
    ])
    .unwrap();
    assert_eq!(
        s.fallback_endpoints()[0].reasoning_effort,
        Some(ReasoningEffort::Xhigh)
    );
    let err = load(&[("OPENAI_REASONING_EFFORT", "max")]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid setting OPENAI_REASONING_EFFORT (openai_reasoning_effort in the config file): \"max\" is not one of none, minimal, low, medium, high, xhigh"
    );
    let err = load(&[("OPENAI_FALLBACK_REASONING_EFFORT", "low")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("OPENAI_FALLBACK_BASE_URL is not set"),
        "{err}"
    );
}
