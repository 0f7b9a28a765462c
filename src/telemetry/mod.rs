//! Logs and traces.
//!
//! Logs go through tracing-subscriber: `RUST_LOG` sets the verbosity (default `info`),
//! `CHECKOUT_LOG_FORMAT=json` makes one JSON object per line.
//!
//! Traces are exported over OTLP/HTTP only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and only the GenAI spans of [`genai`]:
//! `invoke_agent checkout` > `chat {model}` and `execute_tool {name}`. The logs never show
//! those spans, so the log lines read the same with tracing on or off.

pub mod genai;
mod otlp;

use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use crate::config::LogFormat;
pub use otlp::{TraceExport, TraceSetupError};

/// Starts logging, and trace export when the environment asks for it. Keep the returned
/// [`TraceExport`] until the service stops, then call [`TraceExport::shutdown`] so the
/// last spans are sent.
pub fn init(format: LogFormat) -> Result<Option<TraceExport>, TraceSetupError> {
    let export = otlp::from_env()?;
    install(format, export.as_ref());
    Ok(export)
}

/// Starts logging only.
pub fn init_logs(format: LogFormat) {
    install(format, None);
}

fn install(format: LogFormat, export: Option<&TraceExport>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let not_genai = filter_fn(|meta| meta.target() != genai::TARGET);
    let logs = tracing_subscriber::fmt::layer().with_target(false);
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => logs.with_filter(filter.and(not_genai)).boxed(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_filter(filter.and(not_genai))
            .boxed(),
    };
    let layers: Vec<_> = std::iter::once(logs)
        .chain(export.map(TraceExport::layer))
        .collect();
    // A second init (tests building several apps in one process) keeps the first.
    let _ = tracing_subscriber::registry().with(layers).try_init();
}
