//! The HTTP server: accepts connections, counts requests, checks the key, applies the
//! fault plan's transport faults, and hands the rest to the script.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use tokio::net::TcpListener;

use super::plan::{Fault, FaultRule, Pick, Recording, RetryAfter, pick_fault};
use super::script::assistant_answer;
use super::streamed::{self, CloseConnection};
use crate::model::reasoning::ReasoningEffort;
use crate::model::wire::{ChatRequest, Message};

pub(super) struct State {
    pub(super) script: Mutex<Plan>,
    pub(super) requests: AtomicU64,
    /// Tokens reported in answers so far: input, output.
    pub(super) input_tokens: AtomicU64,
    pub(super) output_tokens: AtomicU64,
    pub(super) http2_requests: AtomicU64,
    /// Chat-completions requests that asked `stream: true`.
    pub(super) streamed_requests: AtomicU64,
    /// Requests to `/v1/responses`.
    pub(super) responses_requests: AtomicU64,
    pub(super) connections: AtomicU64,
    pub(super) by_round: Mutex<Vec<u64>>,
    pub(super) arrivals: Mutex<Vec<Instant>>,
    /// The `traceparent` header of each chat-completions request, in order.
    pub(super) traceparents: Mutex<Vec<Option<String>>>,
    /// The bodies of the last [`KEPT_BODIES`] requests, oldest first.
    pub(super) bodies: Mutex<VecDeque<Bytes>>,
}

/// Request bodies kept for a test to read: a few checkouts' worth, so that a benchmark's
/// thousands of requests do not pile up.
pub(super) const KEPT_BODIES: usize = 64;

/// OpenAI's refusal of function tools beside a reasoning effort on chat completions, as
/// its reasoning models send it (issue 48).
const TOOLS_WITH_REASONING: &str = r#"{"error":{"message":"Function tools with reasoning_effort are not supported for gpt-5.6-luna in /v1/chat/completions. To use function tools, use /v1/responses or set reasoning_effort to 'none'.","type":"invalid_request_error","param":"reasoning_effort","code":null}}"#;

pub(super) struct Plan {
    pub(super) rules: Vec<(FaultRule, u32)>,
    pub(super) delay: Duration,
    pub(super) api_key: Option<String>,
}

pub(super) async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        state.connections.fetch_add(1, Ordering::SeqCst);
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(state.clone(), request));
            // HTTP/1.1, or HTTP/2 for a client that starts with its preface (h2c), with no
            // cap on concurrent streams: the benchmark runs thousands on one connection.
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder.http2().max_concurrent_streams(None);
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

type Reply = Response<BoxBody<Bytes, CloseConnection>>;

fn full(bytes: impl Into<Bytes>) -> BoxBody<Bytes, CloseConnection> {
    BoxBody::new(Full::new(bytes.into()).map_err(|never| match never {}))
}

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Result<Reply, CloseConnection> {
    let path = request.uri().path();
    match (request.method(), path) {
        (&Method::POST, "/v1/chat/completions" | "/chat/completions") => {
            completions(&state, request, false).await
        }
        (&Method::POST, "/v1/responses" | "/responses") => completions(&state, request, true).await,
        (&Method::GET, "/v1/models" | "/models") => Ok(json_answer(
            StatusCode::OK,
            &json!({"object": "list", "data": [{"id": super::MODEL, "object": "model", "owned_by": "checkout"}]}),
        )),
        (&Method::GET, "/_scripted/stats") => {
            let by_round = state.by_round.lock().unwrap().clone();
            Ok(json_answer(
                StatusCode::OK,
                &json!({"requests": state.requests.load(Ordering::SeqCst), "byRound": by_round}),
            ))
        }
        _ => Ok(error_answer(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such endpoint",
        )),
    }
}

/// One model request: a chat completion, or (`responses`) a Responses request, the same
/// conversation in that API's items (`responses.rs`).
async fn completions(
    state: &State,
    request: Request<Incoming>,
    responses: bool,
) -> Result<Reply, CloseConnection> {
    let number = state.requests.fetch_add(1, Ordering::SeqCst) + 1;
    if responses {
        state.responses_requests.fetch_add(1, Ordering::SeqCst);
    }
    if request.version() == hyper::Version::HTTP_2 {
        state.http2_requests.fetch_add(1, Ordering::SeqCst);
    }
    state.arrivals.lock().unwrap().push(Instant::now());
    let traceparent = request
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    state.traceparents.lock().unwrap().push(traceparent);
    let authorized = {
        let plan = state.script.lock().unwrap();
        match &plan.api_key {
            None => true,
            Some(key) => {
                request
                    .headers()
                    .get(AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    == Some(key.as_str())
            }
        }
    };
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return Err(CloseConnection),
    };
    {
        let mut bodies = state.bodies.lock().unwrap();
        if bodies.len() == KEPT_BODIES {
            bodies.pop_front();
        }
        bodies.push_back(body.clone());
    }
    if !authorized {
        return Ok(error_answer(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "Incorrect API key provided.",
        ));
    }
    let read = match responses {
        false => serde_json::from_slice(&body)
            .map_err(|err| format!("the request is not a chat completion: {err}")),
        true => super::responses::chat_of(&body),
    };
    let chat: ChatRequest = match read {
        Ok(chat) => chat,
        Err(why) => {
            return Ok(error_answer(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &why,
            ));
        }
    };
    if chat.stream {
        state.streamed_requests.fetch_add(1, Ordering::SeqCst);
    }
    let round = chat
        .messages
        .iter()
        .filter(|m| matches!(m, Message::Assistant { .. }))
        .count() as u32
        + 1;
    {
        let mut by_round = state.by_round.lock().unwrap();
        if by_round.len() < round as usize {
            by_round.resize(round as usize, 0);
        }
        by_round[round as usize - 1] += 1;
    }
    let (
        Pick {
            extra,
            quirks,
            fault,
        },
        base,
    ) = {
        let mut plan = state.script.lock().unwrap();
        let pick = pick_fault(&mut plan.rules, round, number);
        let base = if pick.fault.as_ref().is_some_and(Fault::is_transport) {
            Duration::ZERO
        } else {
            plan.delay
        };
        (pick, base)
    };
    let delay = base + extra;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    match fault {
        Some(Fault::Status {
            status,
            retry_after,
            quota,
        }) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut answer = if quota {
                error_answer(
                    status,
                    "insufficient_quota",
                    "You exceeded your current quota, please check your plan and billing details.",
                )
            } else {
                error_answer(status, "scripted_fault", "scripted fault")
            };
            if let Some(retry_after) = retry_after {
                let value = match retry_after {
                    RetryAfter::Seconds(s) => s.to_string(),
                    RetryAfter::DateIn(s) => {
                        httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(s))
                    }
                };
                answer
                    .headers_mut()
                    .insert(RETRY_AFTER, value.parse().expect("a valid header value"));
            }
            Ok(answer)
        }
        Some(Fault::Timeout) => {
            tokio::time::sleep(Duration::from_secs(300)).await;
            Err(CloseConnection)
        }
        Some(Fault::Close) => Err(CloseConnection),
        Some(Fault::Malformed) => Ok(Response::builder()
            .status(StatusCode::OK)
            .header(CONTENT_TYPE, "application/json")
            .body(full(Bytes::from_static(b"{\"choices\": [{\"message\": ")))
            .expect("a valid response")),
        Some(Fault::EndlessStream) => Ok(streamed_answer(if chat.stream {
            streamed::endless(&chat)
        } else {
            endless_json()
        })),
        Some(Fault::Replay(recording)) => Ok(replayed(&recording)),
        Some(Fault::RefuseToolsWithReasoning)
            if !chat.tools.is_empty() && chat.reasoning_effort != Some(ReasoningEffort::None) =>
        {
            Ok(Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .header(CONTENT_TYPE, "application/json")
                .body(full(TOOLS_WITH_REASONING))
                .expect("a valid response"))
        }
        other => {
            let other = other.filter(|f| *f != Fault::RefuseToolsWithReasoning);
            let broken = other == Some(Fault::BreakStream);
            let fault = other.filter(|_| !broken);
            let answer = assistant_answer(&chat, number, fault, &quirks);
            let tokens = |name: &str| answer["usage"][name].as_u64().unwrap_or(0);
            state
                .input_tokens
                .fetch_add(tokens("prompt_tokens"), Ordering::SeqCst);
            state
                .output_tokens
                .fetch_add(tokens("completion_tokens"), Ordering::SeqCst);
            let answer = match responses {
                true => super::responses::answer_of(&answer, number),
                false => answer,
            };
            Ok(match (chat.stream, broken) {
                (true, _) if responses => {
                    streamed_answer(streamed::body(super::responses::events(&answer), broken))
                }
                (true, _) => {
                    streamed_answer(streamed::body(streamed::pieces(&chat, &answer), broken))
                }
                // Half the JSON body, then the connection dropped.
                (false, true) => {
                    let text = answer.to_string();
                    let half = text.len() / 2;
                    let halves = vec![text[..half].to_owned(), text[half..].to_owned()];
                    let mut reply = streamed_answer(streamed::body(halves, true));
                    reply
                        .headers_mut()
                        .insert(CONTENT_TYPE, "application/json".parse().expect("valid"));
                    reply
                }
                (false, false) => json_answer(StatusCode::OK, &answer),
            })
        }
    }
}

fn replayed(recording: &Recording) -> Reply {
    let mut answer = Response::builder().status(
        StatusCode::from_u16(recording.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
    );
    if let Some(content_type) = &recording.content_type {
        answer = answer.header(CONTENT_TYPE, content_type);
    }
    answer
        .body(full(recording.body.clone()))
        .expect("a valid response")
}

fn json_answer(status: StatusCode, body: &serde_json::Value) -> Reply {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(full(body.to_string()))
        .expect("a valid response")
}

fn streamed_answer(body: BoxBody<Bytes, CloseConnection>) -> Reply {
    Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "text/event-stream")
        .body(body)
        .expect("a valid response")
}

/// A chat completion whose text never ends.
fn endless_json() -> BoxBody<Bytes, CloseConnection> {
    let start = Bytes::from_static(b"{\"choices\": [{\"message\": {\"content\": \"");
    let more = Bytes::from_static(b"and on and on ");
    let frames = futures_util::stream::once(std::future::ready(start))
        .chain(futures_util::stream::repeat(more))
        .map(|bytes| Ok(Frame::data(bytes)));
    BoxBody::new(StreamBody::new(frames))
}

fn error_answer(status: StatusCode, code: &str, message: &str) -> Reply {
    json_answer(
        status,
        &json!({"error": {"message": message, "type": code, "code": code}}),
    )
}
