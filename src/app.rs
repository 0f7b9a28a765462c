//! The app, built once: settings in, every part wired, the start-up lines said, the
//! background workers started; then served until told to stop.

mod announce;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::approvals::Approvals;
use crate::assistant::{self, AgentLoop, Assistant, LoopLimits, Memory, ToolBox};
use crate::caller;
use crate::config::{AuthMode, ModelSource, Settings};
use crate::db::{self, Database, OpenError};
use crate::http::admission::Admission;
use crate::http::rate_limit::RateLimit;
use crate::http::serve::{self, ConnectionLimits};
use crate::http::{self, AppState, ModelInfo, Parts};
use crate::idempotency::Records;
use crate::journal::Journal;
use crate::journal::wake::Wake;
use crate::metrics::Metrics;
use crate::model::scripted::{self, Script, ScriptedModel};
use crate::model::{ClientSettings, LiveOps, ModelChain, ModelClient, ModelEndpoint};
use crate::outbox::{Dispatcher, MailTransport, Outbox};
use crate::payments::stripe::Stripe;
use crate::payments::{Intents, PaymentGateway, Receipts};
use crate::webhooks::{self, Announce, Deliverer, Subscribed};
use crate::worker::{self, Worker, Workers, every};

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
    /// The built-in model, when no model endpoint is configured; it lives as long as the
    /// app.
    scripted: Option<ScriptedModel>,
    /// The background workers: the mail dispatcher, the Idempotency-Key sweep, the API-key
    /// watch, the rate limit's forgetting and the recovery sweep (`CHECKOUT_RECOVERY`).
    /// Each runs until aborted; one that ends sooner stops the service.
    workers: Workers,
    connections: ConnectionLimits,
}

impl App {
    /// Opens the database (applying migrations), starts the scripted model if no model
    /// endpoint is configured, and builds the layers. Logs the resilience chain.
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
        let (endpoint, scripted) = match settings.model_source() {
            ModelSource::Remote(endpoint) => (endpoint, None),
            ModelSource::Scripted { faults, delay } => {
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
                    model: scripted::MODEL.to_owned(),
                    h2c: settings.model.h2c,
                    reasoning_effort: settings.model.reasoning_effort,
                    wire: settings.model.wire_api,
                };
                (endpoint, Some(model))
            }
        };
        let metrics = Metrics::new();
        let chain = model_chain(&endpoint, &settings, &metrics)?;
        let info = ModelInfo {
            provider: if scripted.is_some() { "scripted" } else { "openai-compatible" },
            base_url: endpoint.base_url.clone(),
            model: endpoint.model.clone(),
            warning: scripted.is_some().then_some(
                "the built-in scripted model is in use: no OPENAI_API_KEY or OPENAI_BASE_URL is set, so no real model is asked",
            ),
            breakers: chain.breakers(),
        };
        // One registry of the streams that follow operations here, told by every store
        // that commits journal rows.
        let wake = Arc::new(Wake::default());
        // The events the endpoints want, written by the stores of the facts they announce,
        // in the data the API shows: CHECKOUT_WEBHOOK_URL's, written among the endpoints
        // now, and those `checkout webhooks add` keeps (the deliverer reads them again
        // every second).
        let (configured, endpoints) = match webhooks::endpoints::configure(&db, &settings.webhooks)
            .await
        {
            Ok(endpoints) => (true, endpoints),
            Err(err) => {
                tracing::warn!(error = %err, "webhooks: cannot write CHECKOUT_WEBHOOK_URL among the endpoints yet; the deliverer tries again within a second");
                (false, Vec::new())
            }
        };
        let wanted = Subscribed::new(
            webhooks::endpoints::wanted_by(&endpoints).and(settings.webhooks.wanted()),
        );
        let receipts = Receipts::new(&db, &wake)
            .announcing(
                Announce::new(&wanted, http::views::charge_event),
                Announce::new(&wanted, http::views::refund_event),
            )
            .announcing_budgets(Announce::new(&wanted, http::views::budget_event));
        let gateway = match settings.stripe() {
            Some(stripe) => PaymentGateway::with_provider(
                receipts,
                Intents::new(&db).announcing(Announce::new(&wanted, http::views::budget_event)),
                Stripe::new(&stripe, &metrics).map_err(StartError::PaymentProvider)?,
            ),
            None => PaymentGateway::new(receipts),
        };
        let limits = LoopLimits {
            max_rounds: settings.assistant.max_rounds,
            max_nudges: settings.assistant.max_nudges,
            max_tokens: assistant::MAX_TOKENS,
        };
        let memory = Memory::new(
            settings.assistant.journal.then(|| Journal::new(&db, &wake)),
            settings.idempotency.ttl,
        );
        let outbox = Outbox::new(&db, settings.mail.from.clone());
        let records = Records::new(&db, &wake);
        let transport = MailTransport::new(&settings.mail).map_err(StartError::Mail)?;
        let approvals = Approvals::new(&db, settings.payments.approval_ttl)
            .announcing(Announce::new(&wanted, http::paused::approval_event));
        let tools = ToolBox::new(
            gateway.clone(),
            outbox.clone(),
            approvals.clone(),
            metrics.clone(),
        );
        let live = LiveOps::default();
        let agent = AgentLoop::new(chain.clone(), tools, memory, limits, live.clone());
        let assistant = Assistant::new(
            agent,
            &settings.assistant.retry,
            settings.assistant.journal,
            &metrics,
            &endpoint.model,
        );
        let descriptors = serve::raise_descriptor_limit();
        let bounds = serve::bounds(
            &settings,
            descriptors
                .as_ref()
                .map_or(serve::ASSUMED_DESCRIPTORS, |d| d.soft),
            scripted.is_some(),
        );
        let admission = Admission::new(bounds.max_in_flight, &metrics);
        let rate_limit = RateLimit::new(&settings.overload, &metrics);
        announce::overload(&settings, &descriptors, &bounds);
        announce::chain(&settings, &db, &info);
        announce::endpoints(&settings, &chain);
        announce::callers(&settings, keys_exist);
        announce::mail(&settings, &transport);
        announce::webhooks(
            &settings,
            endpoints
                .iter()
                .filter(|e| !e.from_settings() && e.disabled_at.is_none())
                .count(),
        );
        let deliverer = Deliverer::new(&db, &settings.webhooks, &wanted, &metrics, configured)
            .map_err(StartError::Setting)?;
        announce::recovery(&settings);

        let gate = caller::Gate::new(
            settings.server.auth,
            settings.server.listen,
            &db,
            keys_exist,
        );
        let mut workers = Workers::default();
        workers.spawn(Dispatcher::new(
            outbox.clone(),
            transport,
            settings.mail.clone(),
            metrics.clone(),
        ));
        workers.spawn(deliverer);
        workers.spawn(KeySweep {
            records: records.clone(),
            ttl: settings.idempotency.ttl,
        });
        if let Some(watch) = gate.key_watch() {
            workers.spawn(watch);
        }
        if let Some(limit) = &rate_limit {
            workers.spawn(limit.forgetting());
        }
        let connections = ConnectionLimits {
            max_connections: bounds.max_connections,
            header_timeout: settings.overload.header_timeout,
            idle_timeout: settings.overload.idle_timeout,
        };
        let recovering = settings.idempotency.recovery;
        let state = AppState::new(Parts {
            settings,
            db,
            gateway,
            outbox,
            records,
            approvals,
            assistant,
            model: info,
            metrics,
            gate,
            admission,
            rate_limit,
            live,
            wake,
        });
        if recovering {
            workers.spawn(http::recovery::Recovery(state.clone()));
        }
        workers.spawn(http::approvals::ApprovalSweep(state.clone()));
        Ok(App {
            state,
            scripted,
            workers,
            connections,
        })
    }

    pub fn router(&self) -> Router {
        http::router(self.state.clone())
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// A worker of the embedder's own, watched like the app's: if it ends while the app
    /// serves, the app stops with [`ServeError::Worker`].
    pub fn spawn_worker<W: Worker>(&mut self, worker: W) {
        self.workers.spawn(worker);
    }

    /// Serves until `shutdown` resolves, then lets in-flight checkouts finish. A
    /// background worker that ends first is logged at error level (one line) and stops
    /// the service the same way, with [`ServeError::Worker`]: `main` exits non-zero.
    pub async fn serve(
        mut self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let addr = listener.local_addr()?;
        tracing::info!(%addr, "listening on http://{addr}");
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            tokio::select! {
                () = shutdown => {}
                _ = stopped => {}
            }
        };
        let server = serve::serve(listener, self.router(), self.connections, shutdown);
        tokio::pin!(server);
        let ended = tokio::select! {
            served = &mut server => {
                served?;
                None
            }
            ended = self.workers.ended() => Some(ended),
        };
        if let Some(ended) = &ended {
            tracing::error!(worker = ended.name, "{ended}");
            let _ = stop.send(());
            server.await?;
        }
        self.workers.shutdown().await;
        self.state.db().close().await;
        drop(self.scripted);
        tracing::info!("stopped");
        match ended {
            Some(ended) => Err(ServeError::Worker(ended)),
            None => Ok(()),
        }
    }
}

/// Why the service stopped other than when told to.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
    /// Logged by `serve` already.
    #[error(transparent)]
    Worker(worker::Ended),
}

/// Deletes expired Idempotency-Keys (and ended outbox rows past the TTL) every quarter of
/// the TTL, between 100 ms and a minute.
struct KeySweep {
    records: Records,
    ttl: Duration,
}

impl Worker for KeySweep {
    const NAME: &'static str = "Idempotency-Key sweep";

    async fn run(self) {
        let period = (self.ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
        every(period, || async {
            match self.records.sweep(self.ttl).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(removed = n, "swept expired Idempotency-Keys"),
                Err(err) => tracing::warn!(error = %err, "cannot sweep expired Idempotency-Keys"),
            }
        })
        .await
    }
}

/// The primary endpoint, then the fallbacks: each its own client, request retry, timeout
/// and circuit breaker.
fn model_chain(
    primary: &ModelEndpoint,
    settings: &Settings,
    metrics: &Metrics,
) -> Result<ModelChain, StartError> {
    let endpoints = std::iter::once(primary.clone()).chain(settings.fallback_endpoints());
    let client = ClientSettings {
        retry: settings.model_request.clone(),
        breaker: settings.model.breaker,
        transport: settings.model.transport,
    };
    let clients = endpoints
        .zip(1..)
        .map(|(e, n)| ModelClient::new(&e, n, &client, metrics))
        .collect::<Result<Vec<_>, _>>()
        .map_err(StartError::ModelClient)?;
    Ok(ModelChain::new(clients))
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
