//! The GenAI spans, after the OpenTelemetry GenAI semantic conventions (pinned to semconv
//! v1.37.0, as the metrics are): `invoke_agent checkout` for a whole checkout, every loop
//! attempt in it; `chat {model}` for each chat-completions request, each retry its own
//! span with `http.request.resend_count`; `execute_tool {name}` for each tool call. The
//! loop's own span is not exported, so a chat or tool span's parent is the invoke_agent
//! span. And the `traceparent` header that carries the current span to the model.

use opentelemetry::propagation::Injector;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of these spans: the trace exporter takes only these.
pub const TARGET: &str = "checkout::genai";

/// `gen_ai.provider.name`: the service speaks the OpenAI API to every provider, and the
/// conventions name the provider after the API the client speaks (the model name, and the
/// base URL in the logs, tell the servers apart).
pub const PROVIDER: &str = "openai";

/// `invoke_agent checkout`: one checkout, all of its loop attempts.
pub fn invoke_agent(model: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "invoke_agent",
        otel.name = "invoke_agent checkout",
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = "checkout",
        gen_ai.provider.name = PROVIDER,
        gen_ai.request.model = model,
    )
}

/// `chat {model}`: one chat-completions HTTP request; `attempt` 2 is the first resend.
pub fn chat(model: &str, attempt: u32) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "chat",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = PROVIDER,
        gen_ai.request.model = model,
        http.request.resend_count = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        error.type = Empty,
    );
    if attempt > 1 {
        span.record("http.request.resend_count", attempt - 1);
    }
    span
}

/// What a chat request came to: its token usage when the provider said, or the failure.
pub fn chat_finished(span: &Span, outcome: Result<Option<(u64, u64)>, &'static str>) {
    match outcome {
        Ok(Some((input, output))) => {
            span.record("gen_ai.usage.input_tokens", input);
            span.record("gen_ai.usage.output_tokens", output);
        }
        Ok(None) => {}
        Err(error) => {
            span.record("error.type", error);
            span.record("otel.status_code", "error");
        }
    }
}

/// `execute_tool {name}`: one tool call the model asked for.
pub fn execute_tool(name: &str, call_id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = %format_args!("execute_tool {name}"),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        gen_ai.tool.call.id = call_id,
        gen_ai.tool.type = "function",
    )
}

/// Adds `traceparent` (W3C Trace Context) for the current span, when traces are exported.
pub fn inject_traceparent(headers: &mut HeaderMap) {
    if !super::exporting() {
        return;
    }
    let cx = Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&cx, &mut Headers(headers))
    });
}

struct Headers<'a>(&'a mut HeaderMap);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
