//! The assistant: loop retry ─► loop timeout ─► the tool-calling loop.

pub mod agent;
pub mod arguments;
pub mod context;
pub mod error;
pub mod memory;
pub mod prompts;
pub mod retry;
pub mod tools;

use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tracing::Instrument;

use crate::metrics::Metrics;
use crate::telemetry::genai;

pub use agent::{AgentLoop, CheckoutOutcome, LoopLimits, MessageSource};
pub use context::{ChargeReport, ChargeStatus, Usage};

/// The longest model answer asked for: a tool call or a sentence needs under a hundred
/// tokens; a small model pushed to call a tool has rambled for thousands.
pub const MAX_TOKENS: u32 = 512;
pub use context::{LoopRequest, OperationContext};
pub use error::{CheckoutError, FailureKind, JournalFailure};
pub use memory::Memory;
pub use retry::{LoopRetry, LoopRetrySettings};
pub use tools::ToolBox;

/// The whole loop behind its retry and timeout layers.
#[derive(Clone)]
pub struct Assistant {
    stack: BoxCloneSyncService<LoopRequest, CheckoutOutcome, BoxError>,
    model: std::sync::Arc<str>,
}

impl Assistant {
    /// `resumes`: the loop journals its steps, so a retry resumes it (said in the log).
    /// `model` names the model in the `invoke_agent` span.
    pub fn new(
        agent: AgentLoop,
        settings: &LoopRetrySettings,
        resumes: bool,
        metrics: &Metrics,
        model: &str,
    ) -> Self {
        let model = model.into();
        let stack = ServiceBuilder::new()
            .retry(LoopRetry::new(settings, resumes, metrics))
            .timeout(settings.timeout)
            .service(agent);
        Assistant {
            stack: BoxCloneSyncService::new(stack),
            model,
        }
    }

    /// Runs the operation to its end: its effect confirmed (a charge, a refund), or the
    /// error the retries left.
    pub async fn run(&self, ctx: OperationContext) -> Result<CheckoutOutcome, CheckoutError> {
        let request = LoopRequest { ctx, attempt: 1 };
        let span = genai::invoke_agent(&self.model);
        let run = self.stack.clone().oneshot(request).instrument(span);
        run.await.map_err(|err| {
            *err.downcast::<CheckoutError>()
                .expect("the loop retry turns every failure into a CheckoutError")
        })
    }
}
