//! Logs and traces.
//!
//! Logs go through tracing-subscriber: `RUST_LOG` sets the verbosity (default `info`),
//! `CHECKOUT_LOG_FORMAT=json` makes one JSON object per line.
//!
//! Traces are exported over OTLP/HTTP only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and only the GenAI spans of [`genai`]:
//! `invoke_agent checkout` > `chat {model}` and `execute_tool {name}`. The logs never show
//! those spans, so the log lines read the same with tracing on or off.

mod fields;
pub mod genai;
mod otlp;
#[cfg(test)]
pub(crate) mod testing;

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::subscriber::Interest;
use tracing::{Event, Metadata, span};
use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter, filter_fn};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

pub use otlp::{TraceExport, TraceSetupError};

/// How log lines are written (`CHECKOUT_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

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
    let debug = filter
        .max_level_hint()
        .is_none_or(|level| level >= LevelFilter::DEBUG);
    let not_genai = filter_fn(|meta| meta.target() != genai::TARGET);
    let ansi = colour();
    let logs = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(ansi);
    let filter = Asked(filter.and(not_genai));
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text if !ansi => logs
            .fmt_fields(fields::PlainFields)
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs.json().flatten_event(true).with_filter(filter).boxed(),
    };
    let layers: Vec<_> = std::iter::once(logs)
        .chain(export.map(TraceExport::layer))
        .collect();
    // A second init (tests building several apps in one process) keeps the first, and
    // what it said of debug lines and of trace export.
    if tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .is_ok()
    {
        DEBUG_LOGS.store(debug, Ordering::Relaxed);
        EXPORTING.store(export.is_some(), Ordering::Relaxed);
    }
}

static DEBUG_LOGS: AtomicBool = AtomicBool::new(false);
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported: what only a trace needs is made only then.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Whether the log takes debug lines from anywhere (`RUST_LOG`): what is costly to
/// describe is described only then. False until logging starts.
pub fn debug_logs() -> bool {
    DEBUG_LOGS.load(Ordering::Relaxed)
}

/// Colour codes only on a terminal, and never with `NO_COLOR` set to anything non-empty
/// (no-color.org): a file or a pipe gets plain text.
fn colour() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stdout().is_terminal()
}

/// A per-layer filter that is asked about every span and event, never cached as
/// `Interest::always`.
///
/// tracing-subscriber hands a per-layer filter's verdict to its layer through a
/// thread-local set by `enabled`. A callsite cached as "always" skips `enabled`, so the
/// layer reads whatever the last `enabled` call on that thread left there; sqlx's
/// `log_enabled!` check after every Postgres query (through tracing-log) leaves a "no", and
/// most of a checkout's log lines were silently dropped (tokio-rs/tracing#2519; the
/// upstream fix, #3572, caps the interest the same way and is not released).
pub(crate) struct Asked<F>(pub(crate) F);

impl<S, F: Filter<S>> Filter<S> for Asked<F> {
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        self.0.enabled(meta, cx)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        let interest = self.0.callsite_enabled(meta);
        if interest.is_never() {
            interest
        } else {
            Interest::sometimes()
        }
    }

    fn event_enabled(&self, event: &Event<'_>, cx: &Context<'_, S>) -> bool {
        self.0.event_enabled(event, cx)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.0.max_level_hint()
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, cx: Context<'_, S>) {
        self.0.on_new_span(attrs, id, cx)
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, cx: Context<'_, S>) {
        self.0.on_record(id, values, cx)
    }

    fn on_enter(&self, id: &span::Id, cx: Context<'_, S>) {
        self.0.on_enter(id, cx)
    }

    fn on_exit(&self, id: &span::Id, cx: Context<'_, S>) {
        self.0.on_exit(id, cx)
    }

    fn on_close(&self, id: span::Id, cx: Context<'_, S>) {
        self.0.on_close(id, cx)
    }
}
