//! The OTLP/HTTP trace exporter, configured by the standard `OTEL_*` variables.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{ExporterBuildError, SpanExporter};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::{Layer, Registry};

use super::{Asked, genai};

/// Why traces cannot be exported as the environment asks.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces (OTEL_EXPORTER_OTLP_ENDPOINT): {0}")]
pub struct TraceSetupError(#[from] ExporterBuildError);

/// The running exporter.
pub struct TraceExport {
    provider: SdkTracerProvider,
}

/// Set when traces are wanted: an OTLP endpoint is given and the SDK is not disabled.
fn wanted() -> bool {
    let set = |name| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled =
        std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) && !disabled
}

/// The exporter, when the environment asks for one. Endpoint, headers, timeout and the
/// batch processor's schedule come from the standard variables (`OTEL_EXPORTER_OTLP_*`,
/// `OTEL_BSP_*`); the service name from `OTEL_SERVICE_NAME`, else `checkout`.
pub(super) fn from_env() -> Result<Option<TraceExport>, TraceSetupError> {
    if !wanted() {
        return Ok(None);
    }
    // One TLS provider for the process, as for the model client: an https endpoint needs it.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = SpanExporter::builder().with_http().build()?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("checkout");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Ok(Some(TraceExport { provider }))
}

impl TraceExport {
    /// The layer that turns the GenAI spans into OpenTelemetry spans, and this crate's
    /// info-and-above log events inside them into span events. Every other span — the HTTP
    /// server's, the loop attempt's, and any the exporter's own HTTP client would make — and
    /// every other crate's event is filtered out, so the export never traces itself; a
    /// GenAI span's parent is its nearest GenAI ancestor.
    pub(super) fn layer(&self) -> Box<dyn Layer<Registry> + Send + Sync> {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("checkout"))
            .with_filter(Asked(filter_fn(|meta| {
                meta.target() == genai::TARGET
                    || (meta.is_event()
                        && *meta.level() <= Level::INFO
                        && meta.target().starts_with("checkout::"))
            })))
            .boxed()
    }

    /// Sends the spans still queued and stops the exporter.
    pub fn shutdown(self) {
        if let Err(err) = self.provider.shutdown() {
            tracing::warn!(error = %err, "could not send the last spans");
        }
    }
}
