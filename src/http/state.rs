//! What every handler shares: the settings, the database, the gateway, the idempotency
//! records, the assistant, and which model provider is in use.

use std::sync::Arc;

use serde::Serialize;
use utoipa::ToSchema;

use super::admission::Admission;
use super::rate_limit::RateLimit;
use crate::approvals::Approvals;
use crate::assistant::Assistant;
use crate::caller::Gate;
use crate::config::Settings;
use crate::db::Database;
use crate::idempotency::Records;
use crate::journal::wake::Wake;
use crate::metrics::Metrics;
use crate::model::LiveOps;
use crate::outbox::Outbox;
use crate::payments::PaymentGateway;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState(Arc<Parts>);

/// The parts, each built once by [`crate::App::build`].
pub struct Parts {
    pub settings: Settings,
    pub db: Database,
    pub gateway: PaymentGateway,
    /// Read by the handler (the answer's confirmation); the tool writes through its own
    /// clone.
    pub outbox: Outbox,
    pub records: Records,
    /// Charges waiting for a person, and the decisions.
    pub approvals: Approvals,
    pub assistant: Assistant,
    pub model: ModelInfo,
    pub metrics: Metrics,
    pub gate: Gate,
    /// The bound on loops running at once.
    pub admission: Admission,
    /// The rate limit per caller, when one is set.
    pub rate_limit: Option<RateLimit>,
    /// The operations an event stream watches on this instance: their model answers are
    /// streamed, their text sent as it comes (docs/streaming.md, "Live text").
    pub live: LiveOps,
    /// The streams that follow an operation's journal here, woken when its rows commit.
    pub wake: Arc<Wake>,
}

impl AppState {
    pub fn new(parts: Parts) -> Self {
        AppState(Arc::new(parts))
    }

    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    pub fn live(&self) -> &LiveOps {
        &self.0.live
    }

    pub fn wake(&self) -> &Arc<Wake> {
        &self.0.wake
    }

    /// Who may call `/checkout` and `/receipts`.
    pub fn gate(&self) -> &Gate {
        &self.0.gate
    }

    pub fn settings(&self) -> &Settings {
        &self.0.settings
    }

    pub fn db(&self) -> &Database {
        &self.0.db
    }

    pub fn gateway(&self) -> &PaymentGateway {
        &self.0.gateway
    }

    pub fn approvals(&self) -> &Approvals {
        &self.0.approvals
    }

    pub fn outbox(&self) -> &Outbox {
        &self.0.outbox
    }

    pub fn records(&self) -> &Records {
        &self.0.records
    }

    pub fn assistant(&self) -> &Assistant {
        &self.0.assistant
    }

    pub fn admission(&self) -> &Admission {
        &self.0.admission
    }

    pub fn rate_limit(&self) -> Option<&RateLimit> {
        self.0.rate_limit.as_ref()
    }

    pub fn model_info(&self) -> &ModelInfo {
        &self.0.model
    }
}

/// Which model provider the service talks to.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelInfo {
    /// `scripted` (the built-in scripted model: no real provider is configured) or
    /// `openai-compatible`.
    #[schema(example = "scripted")]
    pub provider: &'static str,
    pub base_url: String,
    pub model: String,
    /// Said plainly when the scripted model is in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<&'static str>,
    /// Every endpoint's breaker, the primary first: `/health/ready` shows their states.
    #[serde(skip)]
    #[schema(ignore)]
    pub breakers: Vec<crate::model::Breaker>,
}
