//! The scripted model: an OpenAI-compatible chat-completions server on loopback, which
//! also serves the same conversation over the Responses API (`/v1/responses`).
//!
//! It is the service's model when no provider is configured, and the tests' model: the
//! service talks to it over HTTP through the same client as to OpenAI, so no test mocks
//! the client. It plays a good checkout assistant (charge the order named in the user
//! message, then confirm in one sentence) unless told to misbehave: a fault plan makes
//! chosen rounds fail with a status, hang, drop the connection, answer slowly, answer
//! garbage, ask for the wrong charge, answer in the forms real servers use, or replay an
//! answer a real server gave. Asked `stream: true`, it streams its answer as real servers
//! do (`streamed`), and a fault can break the stream mid-answer or never end it.
//!
//! A fault plan is a comma-separated list of `FAULT[@ROUND][xTIMES][%PERCENT]`:
//! `timeout@2x3` hangs the first three requests of round 2 (round 1 is the first request
//! of a loop attempt); `503%20` answers 20 % of all requests 503. See [`Fault::parse`].
//!
//! The parts: `plan` (the fault-plan language), `server` (HTTP, counting, transport
//! faults) and `script` (what the assistant answers).

mod plan;
mod responses;
mod script;
mod server;
mod streamed;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use plan::{Fault, FaultRule, RetryAfter, describe};
pub use responses::reasoning_item;
use server::{Plan, State, accept_loop};

/// The model name the built-in scripted model goes by, when it is the service's model (no
/// model configured): in the requests sent to it, so in its answers, the answer's
/// `usage.models`, the start-up lines, the spans and the metrics. What it is, never a
/// real model's name (OPENAI_MODEL names a real endpoint's model).
pub const MODEL: &str = "scripted";

/// What the scripted model is told before it starts.
#[derive(Clone, Debug, Default)]
pub struct Script {
    pub faults: Vec<FaultRule>,
    /// How long every answer takes (the model "thinking"), before any `slow` fault.
    pub delay: Duration,
    /// When set, requests must carry `Authorization: Bearer <key>`, or get a 401.
    pub api_key: Option<String>,
}

/// A running scripted model. Dropping it stops accepting connections.
pub struct ScriptedModel {
    addr: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl ScriptedModel {
    /// Listens on `listen` (port 0 picks a free port) and serves until dropped.
    pub async fn start(listen: SocketAddr, script: Script) -> std::io::Result<ScriptedModel> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            script: Mutex::new(Plan {
                rules: script.faults.into_iter().map(|r| (r, 0)).collect(),
                delay: script.delay,
                api_key: script.api_key,
            }),
            requests: AtomicU64::new(0),
            input_tokens: AtomicU64::new(0),
            output_tokens: AtomicU64::new(0),
            http2_requests: AtomicU64::new(0),
            streamed_requests: AtomicU64::new(0),
            responses_requests: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            by_round: Mutex::new(Vec::new()),
            arrivals: Mutex::new(Vec::new()),
            traceparents: Mutex::new(Vec::new()),
            bodies: Mutex::new(VecDeque::with_capacity(server::KEPT_BODIES)),
        });
        let accept = tokio::spawn(accept_loop(listener, state.clone()));
        Ok(ScriptedModel {
            addr,
            state,
            accept,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL to give a client: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Chat-completions requests received so far, faulted ones included.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Tokens reported in the answers sent so far, as (input, output).
    pub fn tokens(&self) -> (u64, u64) {
        (
            self.state.input_tokens.load(Ordering::SeqCst),
            self.state.output_tokens.load(Ordering::SeqCst),
        )
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Chat-completions requests that came over HTTP/2.
    pub fn requests_over_http2(&self) -> u64 {
        self.state.http2_requests.load(Ordering::SeqCst)
    }

    /// Chat-completions requests that asked for a streamed answer (`stream: true`).
    pub fn streamed_requests(&self) -> u64 {
        self.state.streamed_requests.load(Ordering::SeqCst)
    }

    /// Requests to `/v1/responses` (the Responses API) so far, faulted ones included;
    /// [`requests`](Self::requests) counts them too.
    pub fn responses_requests(&self) -> u64 {
        self.state.responses_requests.load(Ordering::SeqCst)
    }

    /// Requests received so far for round `round` (1-based).
    pub fn requests_at_round(&self, round: u32) -> u64 {
        let by_round = self.state.by_round.lock().unwrap();
        by_round.get(round as usize - 1).copied().unwrap_or(0)
    }

    /// When each chat-completions request arrived, in order.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.state.arrivals.lock().unwrap().clone()
    }

    /// The `traceparent` header of each chat-completions request, in order (`None` when
    /// the request had none).
    pub fn traceparents(&self) -> Vec<Option<String>> {
        self.state.traceparents.lock().unwrap().clone()
    }

    /// The JSON bodies of the last requests received (at most 64), oldest first.
    pub fn recent_requests(&self) -> Vec<serde_json::Value> {
        let bodies = self.state.bodies.lock().unwrap();
        bodies
            .iter()
            .map(|body| serde_json::from_slice(body).unwrap_or(serde_json::Value::Null))
            .collect()
    }

    /// Replaces the fault plan; counts of the new rules start at zero.
    pub fn set_faults(&self, faults: Vec<FaultRule>) {
        self.state.script.lock().unwrap().rules = faults.into_iter().map(|r| (r, 0)).collect();
    }

    pub fn set_delay(&self, delay: Duration) {
        self.state.script.lock().unwrap().delay = delay;
    }
}
