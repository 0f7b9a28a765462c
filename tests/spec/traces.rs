//! Traces: a `checkout` process with `OTEL_EXPORTER_OTLP_ENDPOINT` set exports the GenAI
//! span tree of a checkout over OTLP/HTTP, and sends `traceparent` to the model.
//!
//! The receiver below is a fake: a few lines of axum standing in for an OpenTelemetry
//! collector, decoding the OTLP/HTTP protobuf body with opentelemetry-proto's types, so the
//! test can read every span the exporter sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as SpanStatus;
use prost::Message;

use crate::common::Process;

/// What the fake collector received: the spans, and each export's service name.
#[derive(Clone, Default)]
struct Received {
    spans: Arc<Mutex<Vec<Span>>>,
    services: Arc<Mutex<Vec<String>>>,
}

async fn export(
    State(received): State<Received>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    assert_eq!(
        headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("application/x-protobuf"),
        "OTLP/HTTP protobuf"
    );
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .map(|v| match v {
                Value::StringValue(s) => s.clone(),
                other => format!("{other:?}"),
            })
            .unwrap_or_default();
        received.services.lock().unwrap().push(service);
        for caller in resource.scope_spans {
            received.spans.lock().unwrap().extend(caller.spans);
        }
    }
    let mut answer = HeaderMap::new();
    answer.insert(
        header::CONTENT_TYPE,
        "application/x-protobuf".parse().unwrap(),
    );
    (
        StatusCode::OK,
        answer,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

/// Starts the fake collector on a free loopback port; returns its base URL.
async fn collector(received: Received) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/v1/traces", post(export))
        .with_state(received);
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// A span attribute as text (strings as they are, integers in decimal).
fn attr(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?;
    match value.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_with_one_request_retry_exports_one_agent_span_with_its_chats_and_tool() {
    // The model answers the first request 503: the request retry sends it again.
    let model = crate::common::scripted("503@1x1").await;
    let received = Received::default();
    let endpoint = collector(received.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("checkout.db").display());
    let mut service = Process::start(&[
        ("DATABASE_URL", &db),
        ("OPENAI_BASE_URL", &model.base_url()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("CHECKOUT_REQUEST_BACKOFF_MS", "5"),
        ("CHECKOUT_REQUEST_BACKOFF_MAX_MS", "20"),
    ]);
    let reply = crate::common::post(
        &crate::common::client(),
        &service.url("/checkout?orderId=T-1&amount=12.50"),
        &[],
        None,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // Round 1: the 503 and its resend; round 2: the confirmation.
    assert_eq!(model.requests(), 3);

    let deadline = Instant::now() + Duration::from_secs(10);
    while received.spans.lock().unwrap().len() < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // SIGTERM: whatever is still queued is sent before the process exits.
    service.signal("TERM");
    assert!(service.wait(Duration::from_secs(10)).success());

    let spans = received.spans.lock().unwrap().clone();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let count = |name: &str| names.iter().filter(|n| **n == name).count();
    assert_eq!(spans.len(), 5, "{names:?}");
    assert_eq!(count("invoke_agent checkout"), 1, "{names:?}");
    assert_eq!(count("chat gpt-4o-mini"), 3, "{names:?}");
    assert_eq!(count("execute_tool charge"), 1, "{names:?}");
    assert!(
        received
            .services
            .lock()
            .unwrap()
            .iter()
            .all(|s| s == "checkout"),
        "service.name"
    );

    let agent = spans
        .iter()
        .find(|s| s.name == "invoke_agent checkout")
        .unwrap();
    assert!(agent.parent_span_id.is_empty(), "invoke_agent is the root");
    assert_eq!(
        attr(agent, "gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(
        attr(agent, "gen_ai.agent.name").as_deref(),
        Some("checkout")
    );
    for span in &spans {
        assert_eq!(span.trace_id, agent.trace_id, "{}: one trace", span.name);
        if span.span_id != agent.span_id {
            assert_eq!(
                span.parent_span_id, agent.span_id,
                "{}: under invoke_agent",
                span.name
            );
        }
    }

    let mut chats: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    chats.sort_by_key(|s| s.start_time_unix_nano);
    let resend = |s: &Span| attr(s, "http.request.resend_count");
    // The 503.
    assert_eq!(chats[0].kind, SpanKind::Client as i32);
    assert_eq!(resend(chats[0]), None);
    assert_eq!(attr(chats[0], "error.type").as_deref(), Some("http_503"));
    assert_eq!(
        chats[0].status.as_ref().map(|s| s.code),
        Some(SpanStatus::Error as i32)
    );
    // Its resend, which asks for the charge.
    assert_eq!(resend(chats[1]).as_deref(), Some("1"));
    assert_eq!(attr(chats[1], "error.type"), None);
    // Round 2, the confirmation: a new request, not a resend.
    assert_eq!(resend(chats[2]), None);
    let (input, output) = model.tokens();
    let used = |key: &str| -> u64 {
        chats
            .iter()
            .filter_map(|s| attr(s, key))
            .map(|t| t.parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(used("gen_ai.usage.input_tokens"), input);
    assert_eq!(used("gen_ai.usage.output_tokens"), output);
    for chat in &chats {
        assert_eq!(attr(chat, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(
            attr(chat, "gen_ai.request.model").as_deref(),
            Some("gpt-4o-mini")
        );
    }

    // The tool ran after the resend answered and before the confirmation was asked for.
    let tool = spans
        .iter()
        .find(|s| s.name == "execute_tool charge")
        .unwrap();
    assert_eq!(attr(tool, "gen_ai.tool.name").as_deref(), Some("charge"));
    // The charge ran inside it: its log line is the span's event.
    let events: Vec<&str> = tool.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(events, ["charge tool: charged the order"]);
    assert!(tool.start_time_unix_nano >= chats[1].end_time_unix_nano);
    assert!(tool.end_time_unix_nano <= chats[2].start_time_unix_nano);

    // Each model request carried its own chat span as traceparent.
    let sent: Vec<String> = chats
        .iter()
        .map(|s| format!("00-{}-{}-01", hex(&s.trace_id), hex(&s.span_id)))
        .collect();
    let got: Vec<String> = model
        .traceparents()
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(got, sent);

    // No span of the exporter's own HTTP requests, nor any other: only the GenAI ones.
    let kinds: HashMap<&str, usize> = names.iter().map(|n| (*n, count(n))).collect();
    assert_eq!(kinds.len(), 3, "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_otlp_endpoint_no_traceparent_is_sent() {
    let model = crate::common::scripted("").await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("checkout.db").display());
    let service = Process::start(&[
        ("DATABASE_URL", &db),
        ("OPENAI_BASE_URL", &model.base_url()),
    ]);
    let reply = crate::common::post(
        &crate::common::client(),
        &service.url("/checkout?orderId=T-2&amount=1"),
        &[],
        None,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(model.traceparents(), vec![None, None]);
}
