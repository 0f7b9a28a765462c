//! checkout: an AI assistant takes a payment through a tool-calling loop, and no retry,
//! at any level, charges an order twice. `main.rs` runs this library; tests and the
//! benchmark drive it the same way.

pub mod assistant;
pub mod caller;
pub mod config;
pub mod db;
pub mod http;
pub mod idempotency;
pub mod journal;
pub mod metrics;
pub mod model;
pub mod outbox;
pub mod payments;
pub mod retry;
pub mod secret;
pub mod telemetry;

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use tokio::net::TcpListener;

use assistant::{AgentLoop, Assistant, LoopLimits, Memory, ToolBox};
use caller::AuthMode;
use config::{Provider, Settings};
use db::{Database, OpenError};
use http::{AppState, ModelInfo};
use journal::Journal;
use metrics::Metrics;
use model::scripted::{Script, ScriptedModel};
use model::{ModelClient, ModelEndpoint};
use outbox::{Dispatcher, Outbox, Transport};
use payments::stripe::Stripe;
use payments::{PaymentGateway, Receipts};

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Database(#[from] OpenError),
    #[error("cannot start the scripted model: {0}")]
    ScriptedModel(std::io::Error),
    #[error("cannot build the model client: {0}")]
    ModelClient(tower::BoxError),
    #[error("cannot build the payment provider's client: {0}")]
    PaymentProvider(tower::BoxError),
    /// Settings that would serve open where they must not: exit status 2, like any
    /// setting that cannot work.
    #[error("{0}")]
    Setting(String),
    #[error("cannot read the API keys: {0}")]
    Keys(db::StoreError),
    #[error("{0}")]
    Mail(String),
}

/// The service, built and ready to serve.
pub struct App {
    state: AppState,
    /// The built-in model, when no provider is configured; it lives as long as the app.
    scripted: Option<ScriptedModel>,
    sweeper: tokio::task::JoinHandle<()>,
    /// Delivers the outbox's messages.
    dispatcher: tokio::task::JoinHandle<()>,
    /// Resumes operations whose lease lapsed unfinished (`CHECKOUT_RECOVERY`).
    recovery: Option<tokio::task::JoinHandle<()>>,
    /// Asks whether an API key exists while none does (`CHECKOUT_AUTH=auto`).
    key_watch: tokio::task::JoinHandle<()>,
}

impl App {
    /// Opens the database (applying migrations), starts the scripted model if no provider
    /// is configured, and builds the layers. Logs the resilience chain.
    pub async fn build(settings: Settings) -> Result<App, StartError> {
        let db = Database::open(&settings.database.url, &settings.database.pool).await?;
        // With `off`, keys are not asked about, not even here.
        let keys_exist = match settings.server.auth {
            AuthMode::Off => false,
            AuthMode::Auto | AuthMode::Required => {
                caller::keys_exist(&db).await.map_err(StartError::Keys)?
            }
        };
        check_callers(&settings, keys_exist)?;
        let (endpoint, scripted) = match settings.provider() {
            Provider::Remote(endpoint) => (endpoint, None),
            Provider::Scripted { faults, delay } => {
                let script = Script {
                    faults,
                    delay,
                    api_key: None,
                };
                let model = ScriptedModel::start(SocketAddr::from(([127, 0, 0, 1], 0)), script)
                    .await
                    .map_err(StartError::ScriptedModel)?;
                let endpoint = ModelEndpoint {
                    base_url: model.base_url(),
                    api_key: None,
                    model: settings.model.name.clone(),
                    h2c: settings.model.h2c,
                };
                (endpoint, Some(model))
            }
        };
        let info = ModelInfo {
            provider: if scripted.is_some() { "scripted" } else { "openai-compatible" },
            base_url: endpoint.base_url.clone(),
            model: endpoint.model.clone(),
            warning: scripted.is_some().then_some(
                "the built-in scripted model is in use: no OPENAI_API_KEY or OPENAI_BASE_URL is set, so no real model is asked",
            ),
        };
        let metrics = Metrics::new();
        let client = ModelClient::new(&endpoint, &settings.request, &metrics)
            .map_err(StartError::ModelClient)?;
        let gateway = match settings.stripe() {
            Some(stripe) => PaymentGateway::with_provider(
                Receipts::new(&db),
                Stripe::new(&stripe, &metrics).map_err(StartError::PaymentProvider)?,
            ),
            None => PaymentGateway::new(Receipts::new(&db)),
        };
        let limits = LoopLimits {
            max_rounds: settings.r#loop.max_rounds,
            max_nudges: settings.r#loop.max_nudges,
            max_tokens: assistant::MAX_TOKENS,
        };
        let memory = Memory::new(
            settings.r#loop.journal.then(|| Journal::new(&db)),
            settings.idempotency.ttl,
        );
        let outbox = Outbox::new(&db, settings.mail.from.clone());
        let transport = Transport::new(&settings.mail).map_err(StartError::Mail)?;
        let tools = ToolBox::new(gateway.clone(), outbox.clone(), metrics.clone());
        let agent = AgentLoop::new(client, tools, memory, limits);
        let assistant = Assistant::new(
            agent,
            &settings.r#loop.retry,
            settings.r#loop.journal,
            &metrics,
            &endpoint.model,
        );
        announce(&settings, &db, &info);
        announce_callers(&settings, keys_exist);
        announce_mail(&settings, &transport);
        let dispatcher = tokio::spawn(
            Dispatcher::new(
                outbox.clone(),
                transport,
                settings.mail.clone(),
                metrics.clone(),
            )
            .run(),
        );
        let sweep_every = (settings.idempotency.ttl / 4).clamp(
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(60),
        );
        let sweeper = tokio::spawn(idempotency::sweep_forever(
            idempotency::Records::new(&db),
            sweep_every,
        ));
        let gate = caller::Gate::new(
            settings.server.auth,
            settings.server.listen,
            &db,
            keys_exist,
        );
        let key_watch = tokio::spawn(gate.clone().watch_for_keys());
        announce_recovery(&settings);
        let recovering = settings.idempotency.recovery;
        let state = AppState::new(settings, db, gateway, assistant, info, metrics, gate);
        let recovery =
            recovering.then(|| tokio::spawn(http::recovery::sweep_forever(state.clone())));
        Ok(App {
            state,
            scripted,
            sweeper,
            dispatcher,
            recovery,
            key_watch,
        })
    }

    pub fn router(&self) -> Router {
        http::router(self.state.clone())
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` resolves, then lets in-flight checkouts finish.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let addr = listener.local_addr()?;
        tracing::info!(%addr, "listening on http://{addr}");
        axum::serve(listener, self.router())
            .with_graceful_shutdown(async move {
                shutdown.await;
                tracing::info!("shutting down: finishing in-flight checkouts");
            })
            .await?;
        self.sweeper.abort();
        self.dispatcher.abort();
        if let Some(recovery) = &self.recovery {
            recovery.abort();
        }
        self.key_watch.abort();
        self.state.db().close().await;
        drop(self.scripted);
        tracing::info!("stopped");
        Ok(())
    }
}

/// `CHECKOUT_AUTH=auto` never serves open on an address others can reach.
fn check_callers(settings: &Settings, keys_exist: bool) -> Result<(), StartError> {
    let listen = settings.server.listen;
    if settings.server.auth == AuthMode::Auto && !listen.ip().is_loopback() && !keys_exist {
        return Err(StartError::Setting(format!(
            "CHECKOUT_AUTH=auto serves without API keys only on a loopback address, and no API key exists: on {listen} anyone who can reach the port could charge orders. Make a key first (checkout api-keys create NAME), or set CHECKOUT_AUTH=required, or CHECKOUT_AUTH=off to serve open on {listen} on purpose"
        )));
    }
    Ok(())
}

/// The start-up line of the recovery sweep.
fn announce_recovery(settings: &Settings) {
    let idempotency = &settings.idempotency;
    if idempotency.recovery {
        tracing::info!(
            max_attempts = idempotency.recovery_max_attempts,
            "recovery sweep: every {} ms, an operation whose lease lapsed unfinished at least {} ms ago (its instance died, or its client left after a transient failure) is taken over, resumed from its journal and its answer saved for the client's retry; at most {} time(s), then it is marked as needing attention and logged at error level",
            idempotency.lease.as_millis(),
            idempotency.lease.as_millis(),
            idempotency.recovery_max_attempts
        );
    } else {
        tracing::warn!(
            "recovery sweep: off (CHECKOUT_RECOVERY=false): an operation whose instance died is resumed only by its client's retry with the same Idempotency-Key"
        );
    }
}

/// The start-up line that says where confirmation emails go.
fn announce_mail(settings: &Settings, transport: &Transport) {
    let mail = &settings.mail;
    let from = mail.from.to_string();
    match transport {
        Transport::Smtp(_) => tracing::info!(
            smtp = mail.shown_url().unwrap_or_default(),
            from,
            "confirmation emails: sent to the SMTP server {} (pooled), from {from}; a transient failure is retried up to {} attempts, backoff {}..{} ms; a message claimed by an instance that died is sent again after {} ms, with the same Message-ID",
            mail.shown_url().unwrap_or_default(),
            mail.max_attempts,
            mail.backoff_min.as_millis(),
            mail.backoff_max.as_millis(),
            mail.lease.as_millis()
        ),
        Transport::Files(dir) => tracing::warn!(
            dir = %dir.display(),
            from,
            "confirmation emails: no CHECKOUT_SMTP_URL is set, so no email leaves this machine: each message is written as <message-id>.eml in {}",
            dir.display()
        ),
    }
}

/// The start-up line that says who may call.
fn announce_callers(settings: &Settings, keys_exist: bool) {
    let listen = settings.server.listen;
    let mode = settings.server.auth.as_str();
    match settings.server.auth {
        AuthMode::Off => tracing::warn!(
            auth = mode,
            "callers: CHECKOUT_AUTH=off: /checkout and /receipts are open to anyone who can reach {listen}; no API key is read"
        ),
        AuthMode::Required => tracing::info!(
            auth = mode,
            "callers: an API key is required on /checkout and /receipts (CHECKOUT_AUTH=required){}",
            if keys_exist {
                ""
            } else {
                "; none exists yet, so every request is refused until one is made (checkout api-keys create NAME)"
            }
        ),
        AuthMode::Auto if keys_exist => tracing::info!(
            auth = mode,
            "callers: an API key is required on /checkout and /receipts (CHECKOUT_AUTH=auto, and keys exist)"
        ),
        AuthMode::Auto => tracing::warn!(
            auth = mode,
            "callers: open, no API key asked for (CHECKOUT_AUTH=auto, no key exists yet, {listen} is loopback); within {} ms of the first `checkout api-keys create NAME`, every request needs a key",
            caller::KEYS_REFRESH.as_millis()
        ),
    }
}

/// The start-up lines: the database, the model, and the resilience chain, outermost
/// first, each layer with its unit, its numbers and what it retries.
fn announce(settings: &Settings, db: &Database, model: &ModelInfo) {
    tracing::info!(database = db.kind(), "receipts are kept in {}", db.kind());
    match model.warning {
        Some(warning) => tracing::warn!(base_url = %model.base_url, "{warning}"),
        None => {
            tracing::info!(base_url = %model.base_url, model = %model.model, "model provider: OpenAI-compatible")
        }
    }
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    tracing::info!(
        layer = 1,
        unit = "the whole operation",
        "resilience chain, outermost first: [1] client POST + Idempotency-Key: the client may retry; a key's finished answer is replayed for {} s, a key in flight is held by a {} ms lease, a transient failure leaves the key usable",
        settings.idempotency.ttl.as_secs(),
        ms(settings.idempotency.lease)
    );
    tracing::info!(
        layer = 2,
        unit = "one HTTP request",
        timeout_ms = ms(settings.server.timeout),
        "[2] server timeout: {} ms per HTTP request (the loop layers' worst case is {} ms)",
        ms(settings.server.timeout),
        ms(settings.loop_worst_case())
    );
    tracing::info!(
        layer = 3,
        unit = "the whole assistant loop, tools included",
        max_retries = settings.r#loop.retry.max_retries,
        journal = settings.r#loop.journal,
        "[3] loop retry: repeats the whole assistant loop up to {} more time(s), backoff {}..{} ms; on a loop timeout, a model failure the request retry could not mend, a transient database error, a payment provider that gave no outcome; never on a model 4xx, invalid input, amount_conflict, model_did_not_charge, a declined payment. {}",
        settings.r#loop.retry.max_retries,
        ms(settings.r#loop.retry.backoff_min),
        ms(settings.r#loop.retry.backoff_max),
        if settings.r#loop.journal {
            "Journal on: a repeat (and a client's retry with the same Idempotency-Key, or another instance's) resumes from the journal, replaying the steps that ended instead of asking the model again"
        } else {
            "Journal off (CHECKOUT_JOURNAL=false): every repeat starts the loop over"
        }
    );
    tracing::info!(
        layer = 4,
        unit = "one run of the assistant loop",
        timeout_ms = ms(settings.r#loop.retry.timeout),
        "[4] loop timeout: {} ms per run of the loop, at most {} model rounds; a model that ends without charging is asked again up to {} time(s) before model_did_not_charge",
        ms(settings.r#loop.retry.timeout),
        settings.r#loop.max_rounds,
        settings.r#loop.max_nudges
    );
    tracing::info!(
        layer = 5,
        unit = "one chat-completions HTTP request",
        max_retries = settings.request.max_retries,
        "[5] request retry: repeats one model request up to {} more time(s), backoff {}..{} ms with jitter, Retry-After honoured up to {} ms, retry budget {}% + {}/s shared by all requests; on connect errors, timeouts, 408, 429 (not insufficient_quota), 500, 502, 503, 504; never on 400, 401, 403, 404, 422",
        settings.request.max_retries,
        ms(settings.request.backoff_min),
        ms(settings.request.backoff_max),
        ms(settings.request.retry_after_max),
        settings.request.budget_percent,
        settings.request.budget_min_per_sec
    );
    tracing::info!(
        layer = 6,
        unit = "one chat-completions HTTP request",
        timeout_ms = ms(settings.request.timeout),
        "[6] request timeout: {} ms per model request",
        ms(settings.request.timeout)
    );
    match settings.stripe() {
        None => tracing::info!(
            provider = "ledger",
            "payment provider: ledger (CHECKOUT_PAYMENT_PROVIDER=ledger): the receipts table is the record of charges; no money moves elsewhere"
        ),
        Some(stripe) => {
            tracing::info!(
                provider = "stripe",
                base_url = %stripe.base_url,
                "payment provider: stripe at {}: each charge commits an intent (order, amount, currency, payment method, attempt), then POST /v1/payment_intents with Idempotency-Key = charge key + attempt and the intent's parameters, then the receipt. An intent left open is re-sent by the next run of any unit within the key retention ({} s), looked up by its metadata after it, never charged anew",
                stripe.base_url,
                stripe.key_retention.as_secs()
            );
            tracing::info!(
                layer = 7,
                unit = "one payment-provider HTTP request",
                max_retries = stripe.max_retries,
                "[7] provider retry: re-sends one payment-provider request with the same Idempotency-Key and parameters up to {} more time(s), backoff {}..{} ms; on timeouts, dropped connections, 409 idempotency_key_in_use, 429, 5xx, then looks the payment up; never on 402 (declined: the attempt ends) or another 4xx (400 idempotency_error is a bug: 502)",
                stripe.max_retries,
                ms(stripe.backoff_min),
                ms(stripe.backoff_max)
            );
            tracing::info!(
                layer = 8,
                unit = "one payment-provider HTTP request",
                timeout_ms = ms(stripe.timeout),
                "[8] provider timeout: {} ms per payment-provider request",
                ms(stripe.timeout)
            );
        }
    }
    if settings.r#loop.retry.max_retries > 0 && !settings.r#loop.journal {
        tracing::warn!(
            "the loop retry re-runs tools that already ran, the charge included; it cannot double-charge here because every attempt charges with the charge key the handler made from the order id before the first attempt, and the receipts table's unique order_id hands a repeated charge the first receipt"
        );
    }
}
