//! The scripted model: an OpenAI-compatible chat-completions server on loopback.
//!
//! It is the service's model when no provider is configured, and the tests' model: the
//! service talks to it over HTTP through the same client as to OpenAI, so no test mocks
//! the client. It plays a good checkout assistant (charge the order named in the user
//! message, then confirm in one sentence) unless told to misbehave: a fault plan makes
//! chosen rounds fail with a status, hang, drop the connection, answer slowly, answer
//! garbage, or ask for the wrong charge.
//!
//! A fault plan is a comma-separated list of `FAULT[@ROUND][xTIMES][%PERCENT]`:
//! `timeout@2x3` hangs the first three requests of round 2 (round 1 is the first request
//! of a loop attempt); `503%20` answers 20 % of all requests 503. See [`Fault::parse`].

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::wire::{ChatRequest, Message};

/// How a round misbehaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer this HTTP status with an OpenAI-style error body.
    Status {
        status: u16,
        retry_after: Option<RetryAfter>,
        /// 429 with code `insufficient_quota`: the account is out of credit.
        quota: bool,
    },
    /// Never answer (the client's request timeout must fire).
    Timeout,
    /// Close the connection without answering.
    Close,
    /// Answer normally, this much later.
    Slow(Duration),
    /// Answer 200 with a body that is not JSON.
    Malformed,
    /// Ask to charge another order than the user named.
    WrongOrder,
    /// Ask to charge another amount than the user named.
    WrongAmount,
    /// Ask for the same charge twice in one answer.
    DoubleCharge,
    /// Ask to charge even though the order is charged; with no round, forever.
    Recharge,
    /// Answer in text without charging.
    NoCharge,
    /// Call a tool that does not exist.
    UnknownTool,
    /// Write tool arguments that are not valid JSON.
    BadArguments,
    /// Leave the amount out of the tool arguments.
    MissingField,
    /// Write the amount as a JSON number instead of a string.
    NumericAmount,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfter {
    Seconds(u64),
    /// An HTTP date this many seconds ahead.
    DateIn(u64),
}

/// A fault, where it applies and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    pub fault: Fault,
    /// The round it applies to; every round when unset.
    pub round: Option<u32>,
    /// How many requests it hits before it is spent; unlimited when unset.
    pub times: Option<u32>,
    /// The share of matching requests it hits (pseudo-random, reproducible).
    pub percent: Option<u8>,
}

impl Fault {
    /// Parses one fault: `503`, `503+retry-after=2`, `503+retry-after-date=2`, `429+quota`,
    /// `timeout`, `close`, `slow=1500`, `malformed`, `wrong-order`, `wrong-amount`,
    /// `double-charge`, `recharge` (alias `never-stop`), `no-charge`, `unknown-tool`,
    /// `bad-arguments`, `missing-field`, `numeric-amount`.
    pub fn parse(text: &str) -> Result<Fault, String> {
        let mut parts = text.split('+');
        let head = parts.next().unwrap_or_default();
        let options: Vec<&str> = parts.collect();
        if let Ok(status) = head.parse::<u16>() {
            if !(400..600).contains(&status) {
                return Err(format!("{status} is not an error status"));
            }
            let mut fault = Fault::Status {
                status,
                retry_after: None,
                quota: false,
            };
            for option in options {
                let Fault::Status {
                    retry_after, quota, ..
                } = &mut fault
                else {
                    unreachable!()
                };
                match option.split_once('=') {
                    Some(("retry-after", secs)) => {
                        *retry_after = Some(RetryAfter::Seconds(parse_number(secs, option)?))
                    }
                    Some(("retry-after-date", secs)) => {
                        *retry_after = Some(RetryAfter::DateIn(parse_number(secs, option)?))
                    }
                    None if option == "quota" => *quota = true,
                    _ => return Err(format!("unknown status option {option:?}")),
                }
            }
            return Ok(fault);
        }
        if !options.is_empty() {
            return Err(format!("{head:?} takes no options"));
        }
        Ok(match head.split_once('=') {
            Some(("slow", ms)) => Fault::Slow(Duration::from_millis(parse_number(ms, head)?)),
            Some(_) => return Err(format!("unknown fault {head:?}")),
            None => match head {
                "timeout" => Fault::Timeout,
                "close" => Fault::Close,
                "malformed" => Fault::Malformed,
                "wrong-order" => Fault::WrongOrder,
                "wrong-amount" => Fault::WrongAmount,
                "double-charge" => Fault::DoubleCharge,
                "recharge" | "never-stop" => Fault::Recharge,
                "no-charge" => Fault::NoCharge,
                "unknown-tool" => Fault::UnknownTool,
                "bad-arguments" => Fault::BadArguments,
                "missing-field" => Fault::MissingField,
                "numeric-amount" => Fault::NumericAmount,
                _ => return Err(format!("unknown fault {head:?}")),
            },
        })
    }

    /// Faults that are a failure of the HTTP exchange, answered without "thinking".
    fn is_transport(&self) -> bool {
        matches!(self, Fault::Status { .. } | Fault::Close | Fault::Timeout)
    }
}

impl FaultRule {
    /// Parses a plan: `FAULT[@ROUND][xTIMES][%PERCENT]`, comma-separated. Empty is none.
    pub fn parse_plan(plan: &str) -> Result<Vec<FaultRule>, String> {
        plan.split(',')
            .map(str::trim)
            .filter(|rule| !rule.is_empty())
            .map(|rule| FaultRule::parse(rule).map_err(|e| format!("fault {rule:?}: {e}")))
            .collect()
    }

    fn parse(text: &str) -> Result<FaultRule, String> {
        let (rest, percent) = match text.rsplit_once('%') {
            Some((rest, p)) => {
                let p: u8 = parse_number(p, text)?;
                if p > 100 {
                    return Err("a percent is at most 100".into());
                }
                (rest, Some(p))
            }
            None => (text, None),
        };
        let (rest, times) = match rest.rsplit_once('x') {
            Some((rest, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                (rest, Some(parse_number(n, text)?))
            }
            _ => (rest, None),
        };
        let (fault, round) = match rest.split_once('@') {
            Some((fault, round)) => (fault, Some(parse_number(round, text)?)),
            None => (rest, None),
        };
        Ok(FaultRule {
            fault: Fault::parse(fault)?,
            round,
            times,
            percent,
        })
    }
}

fn parse_number<T: std::str::FromStr>(text: &str, context: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{text:?} in {context:?} is not a number"))
}

/// What the scripted model is told before it starts.
#[derive(Clone, Debug, Default)]
pub struct Script {
    pub faults: Vec<FaultRule>,
    /// How long every answer takes (the model "thinking"), before any `slow` fault.
    pub delay: Duration,
    /// When set, requests must carry `Authorization: Bearer <key>`, or get a 401.
    pub api_key: Option<String>,
}

struct State {
    script: Mutex<Plan>,
    requests: AtomicU64,
    http2_requests: AtomicU64,
    by_round: Mutex<Vec<u64>>,
    arrivals: Mutex<Vec<Instant>>,
}

struct Plan {
    rules: Vec<(FaultRule, u32)>,
    delay: Duration,
    api_key: Option<String>,
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
            http2_requests: AtomicU64::new(0),
            by_round: Mutex::new(Vec::new()),
            arrivals: Mutex::new(Vec::new()),
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

    /// Chat-completions requests that came over HTTP/2.
    pub fn requests_over_http2(&self) -> u64 {
        self.state.http2_requests.load(Ordering::SeqCst)
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

    /// Replaces the fault plan; counts of the new rules start at zero.
    pub fn set_faults(&self, faults: Vec<FaultRule>) {
        self.state.script.lock().unwrap().rules = faults.into_iter().map(|r| (r, 0)).collect();
    }

    pub fn set_delay(&self, delay: Duration) {
        self.state.script.lock().unwrap().delay = delay;
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
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

/// Returned by the service to make hyper drop the connection without an answer.
#[derive(Debug)]
struct CloseConnection;

impl std::fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("scripted fault: connection closed")
    }
}

impl std::error::Error for CloseConnection {}

type Answer = Response<Full<Bytes>>;

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Result<Answer, CloseConnection> {
    let path = request.uri().path();
    match (request.method(), path) {
        (&Method::POST, "/v1/chat/completions" | "/chat/completions") => {
            completions(&state, request).await
        }
        (&Method::GET, "/v1/models" | "/models") => Ok(json_answer(
            StatusCode::OK,
            &json!({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "checkout"}]}),
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

async fn completions(state: &State, request: Request<Incoming>) -> Result<Answer, CloseConnection> {
    let number = state.requests.fetch_add(1, Ordering::SeqCst) + 1;
    if request.version() == hyper::Version::HTTP_2 {
        state.http2_requests.fetch_add(1, Ordering::SeqCst);
    }
    state.arrivals.lock().unwrap().push(Instant::now());
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
    if !authorized {
        return Ok(error_answer(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "Incorrect API key provided.",
        ));
    }
    let chat: ChatRequest = match serde_json::from_slice(&body) {
        Ok(chat) => chat,
        Err(err) => {
            return Ok(error_answer(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("the request is not a chat completion: {err}"),
            ));
        }
    };
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
    let (fault, delay) = {
        let mut plan = state.script.lock().unwrap();
        let (extra, fault) = pick_fault(&mut plan.rules, round, number);
        let base = if fault.as_ref().is_some_and(Fault::is_transport) {
            Duration::ZERO
        } else {
            plan.delay
        };
        (fault, base + extra)
    };
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
            .body(Full::new(Bytes::from_static(
                b"{\"choices\": [{\"message\": ",
            )))
            .expect("a valid response")),
        other => Ok(assistant_answer(&chat, number, other)),
    }
}

/// The fault for this request, and any extra delay: `slow` rules add to the delay and
/// let the next matching rule choose the answer, so `slow` composes with other faults.
fn pick_fault(
    rules: &mut [(FaultRule, u32)],
    round: u32,
    number: u64,
) -> (Duration, Option<Fault>) {
    let mut extra = Duration::ZERO;
    for (index, (rule, used)) in rules.iter_mut().enumerate() {
        if rule.round.is_some_and(|r| r != round) {
            continue;
        }
        if rule.times.is_some_and(|times| *used >= times) {
            continue;
        }
        let draw = splitmix64(number ^ ((index as u64 + 1) << 48)) % 100;
        if rule
            .percent
            .is_some_and(|percent| draw >= u64::from(percent))
        {
            continue;
        }
        *used += 1;
        match &rule.fault {
            Fault::Slow(delay) => extra += *delay,
            fault => return (extra, Some(fault.clone())),
        }
    }
    (extra, None)
}

/// A reproducible stand-in for a random draw.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// What the order looks like to the model: read from the user message, as a model would.
struct Asked {
    order: String,
    amount: String,
}

fn asked(chat: &ChatRequest) -> Option<Asked> {
    let text = chat.messages.iter().rev().find_map(|m| match m {
        Message::User { content } => Some(content.as_str()),
        _ => None,
    })?;
    let words: Vec<&str> = text.split_whitespace().collect();
    let after = |word: &str| {
        words
            .iter()
            .position(|w| *w == word)
            .and_then(|i| words.get(i + 1))
            .map(|w| w.trim_end_matches('.').to_owned())
    };
    Some(Asked {
        order: after("order")?,
        amount: after("of")?,
    })
}

/// The receipt of a charge tool result in the conversation, if there is one.
fn charged(chat: &ChatRequest) -> Option<serde_json::Value> {
    chat.messages.iter().find_map(|m| match m {
        Message::Tool { content, .. } => serde_json::from_str::<serde_json::Value>(content)
            .ok()
            .filter(|v| v.get("status").and_then(|s| s.as_str()) == Some("charged")),
        _ => None,
    })
}

fn assistant_answer(chat: &ChatRequest, number: u64, fault: Option<Fault>) -> Answer {
    let Some(asked) = asked(chat) else {
        return completion(
            chat,
            number,
            Some("I could not find an order to charge."),
            vec![],
        );
    };
    let done = charged(chat);
    let call = |arguments: String| (String::from("charge"), arguments);
    let charge_args =
        |order: &str, amount: &str| json!({"orderId": order, "amount": amount}).to_string();
    let calls: Vec<(String, String)> = match fault {
        Some(Fault::NoCharge) => {
            return completion(
                chat,
                number,
                Some("Thank you, your order is noted."),
                vec![],
            );
        }
        Some(Fault::WrongOrder) => vec![call(charge_args(
            &format!("{}-OTHER", asked.order),
            &asked.amount,
        ))],
        Some(Fault::WrongAmount) => vec![call(charge_args(
            &asked.order,
            &format!("1{}", asked.amount),
        ))],
        Some(Fault::DoubleCharge) => {
            let args = charge_args(&asked.order, &asked.amount);
            vec![call(args.clone()), call(args)]
        }
        Some(Fault::Recharge) => vec![call(charge_args(&asked.order, &asked.amount))],
        Some(Fault::UnknownTool) => {
            vec![("refund".into(), charge_args(&asked.order, &asked.amount))]
        }
        Some(Fault::BadArguments) => {
            vec![call(format!(
                "{{\"orderId\": \"{}\", \"amount\": ",
                asked.order
            ))]
        }
        Some(Fault::MissingField) => vec![call(json!({"orderId": asked.order}).to_string())],
        Some(Fault::NumericAmount) if done.is_none() => vec![call(format!(
            "{{\"orderId\": {}, \"amount\": {}}}",
            serde_json::Value::String(asked.order.clone()),
            asked.amount
        ))],
        _ => match &done {
            Some(receipt) => {
                let field = |name: &str| receipt.get(name).and_then(|v| v.as_str()).unwrap_or("?");
                let text = format!(
                    "Your payment of {} {} for order {} went through; your receipt is {}.",
                    field("amount"),
                    field("currency"),
                    field("orderId"),
                    field("receiptId"),
                );
                return completion(chat, number, Some(&text), vec![]);
            }
            None => vec![call(charge_args(&asked.order, &asked.amount))],
        },
    };
    completion(chat, number, None, calls)
}

fn completion(
    chat: &ChatRequest,
    number: u64,
    text: Option<&str>,
    calls: Vec<(String, String)>,
) -> Answer {
    let tool_calls: Vec<serde_json::Value> = calls
        .into_iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            json!({
                "id": format!("call_{number}_{}", i + 1),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            })
        })
        .collect();
    let finish = if tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let mut message = json!({"role": "assistant", "content": text});
    if !tool_calls.is_empty() {
        message["tool_calls"] = serde_json::Value::Array(tool_calls);
    }
    let created = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    json_answer(
        StatusCode::OK,
        &json!({
            "id": format!("chatcmpl-scripted-{number}"),
            "object": "chat.completion",
            "created": created,
            "model": chat.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }),
    )
}

fn json_answer(status: StatusCode, body: &serde_json::Value) -> Answer {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid response")
}

fn error_answer(status: StatusCode, code: &str, message: &str) -> Answer {
    json_answer(
        status,
        &json!({"error": {"message": message, "type": code, "code": code}}),
    )
}

/// The plan as written, for start-up logs.
pub fn describe(rules: &[FaultRule]) -> String {
    let mut out = String::new();
    for (i, rule) in rules.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{:?}", rule.fault);
        if let Some(round) = rule.round {
            let _ = write!(out, " at round {round}");
        }
        if let Some(times) = rule.times {
            let _ = write!(out, ", {times} time(s)");
        }
        if let Some(percent) = rule.percent {
            let _ = write!(out, " on {percent}% of requests");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse() {
        let plan = FaultRule::parse_plan(
            "timeout@2x3, 503+retry-after=1@1x1,503%20,429+quota,slow=1500@2,recharge",
        )
        .unwrap();
        assert_eq!(
            plan[0],
            FaultRule {
                fault: Fault::Timeout,
                round: Some(2),
                times: Some(3),
                percent: None
            }
        );
        assert_eq!(
            plan[1].fault,
            Fault::Status {
                status: 503,
                retry_after: Some(RetryAfter::Seconds(1)),
                quota: false
            }
        );
        assert_eq!((plan[1].round, plan[1].times), (Some(1), Some(1)));
        assert_eq!((plan[2].percent, plan[2].round), (Some(20), None));
        assert_eq!(
            plan[3].fault,
            Fault::Status {
                status: 429,
                retry_after: None,
                quota: true
            }
        );
        assert_eq!(plan[4].fault, Fault::Slow(Duration::from_millis(1500)));
        assert_eq!(
            plan[5],
            FaultRule {
                fault: Fault::Recharge,
                round: None,
                times: None,
                percent: None
            }
        );
        assert!(FaultRule::parse_plan("").unwrap().is_empty());
    }

    #[test]
    fn bad_plans_say_what_is_wrong() {
        assert_eq!(
            FaultRule::parse_plan("explode@1").unwrap_err(),
            "fault \"explode@1\": unknown fault \"explode\""
        );
        assert!(
            FaultRule::parse_plan("200")
                .unwrap_err()
                .contains("not an error status")
        );
        assert!(
            FaultRule::parse_plan("timeout@two")
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            FaultRule::parse_plan("close+quota")
                .unwrap_err()
                .contains("takes no options")
        );
    }

    #[test]
    fn rules_are_spent_after_their_times() {
        let mut rules: Vec<(FaultRule, u32)> = FaultRule::parse_plan("close@2x2")
            .unwrap()
            .into_iter()
            .map(|r| (r, 0))
            .collect();
        assert_eq!(pick_fault(&mut rules, 1, 1).1, None);
        assert_eq!(pick_fault(&mut rules, 2, 2).1, Some(Fault::Close));
        assert_eq!(pick_fault(&mut rules, 2, 3).1, Some(Fault::Close));
        assert_eq!(pick_fault(&mut rules, 2, 4).1, None);
    }

    #[test]
    fn slow_composes_with_the_next_rule() {
        let mut rules: Vec<(FaultRule, u32)> = FaultRule::parse_plan("slow=100@2,recharge@2")
            .unwrap()
            .into_iter()
            .map(|r| (r, 0))
            .collect();
        assert_eq!(
            pick_fault(&mut rules, 2, 1),
            (Duration::from_millis(100), Some(Fault::Recharge))
        );
    }

    #[test]
    fn percent_rules_hit_about_that_share() {
        let mut rules: Vec<(FaultRule, u32)> = FaultRule::parse_plan("503%20")
            .unwrap()
            .into_iter()
            .map(|r| (r, 0))
            .collect();
        let hits = (1..=10_000)
            .filter(|n| pick_fault(&mut rules, 1, *n).1.is_some())
            .count();
        assert!((1_800..=2_200).contains(&hits), "{hits} of 10000");
    }
}
