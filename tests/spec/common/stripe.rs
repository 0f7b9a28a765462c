//! A Stripe-compatible fake: the subset of the PaymentIntents API the service uses
//! (`POST /v1/payment_intents` confirmed at once, `GET /v1/payment_intents/search` by
//! metadata) and of the Refunds API (`POST /v1/refunds` of a payment intent, never past
//! its amount; `GET /v1/refunds?payment_intent=…`), honouring `Idempotency-Key` as Stripe
//! documents it, for refunds as for charges (one key space, as Stripe's per account).
//!
//! Why a fake: Stripe's test mode is a real server, but it is unreachable from here, and it
//! cannot be made to fail on cue after executing a charge (drop the connection before
//! answering, answer 500 after executing, answer late), which is what the tests are about.
//! What it keeps from Stripe (https://docs.stripe.com/api/idempotent_requests):
//! - a key's first request executes, and its result is saved, a 500 included; the same key
//!   with the same parameters gets the saved result, and executes nothing;
//! - the same key with other parameters: 400, `type: idempotency_error`;
//! - the same key while its first request is executing: 409 `idempotency_key_in_use`;
//! - test payment methods: `pm_card_visa` succeeds, `pm_card_chargeDeclined` is declined
//!   (402 `card_error`, `decline_code: generic_decline`), `pm_card_authenticationRequired`
//!   needs 3-D Secure (`status: requires_action`).
//!
//! Also run from the command line, as docs/effects.md shows: `cargo run --example stripe-fake`.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// What the fake does to the next execution (a key's first request), in order.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Executes, saves the result, then drops the connection before answering.
    DropAnswer,
    /// Executes, then saves and answers 500 (every repeat of the key gets the 500).
    Answer500,
    /// Executes and saves the result, then waits this long before answering.
    DelayAnswer(Duration),
    /// Holds the key as in progress this long, then executes and answers.
    DelayExecution(Duration),
    /// Answers 500 without executing: nothing is saved, nothing charged.
    FailBeforeExecuting,
}

/// The fake, serving on loopback until dropped.
pub struct StripeFake {
    addr: SocketAddr,
    state: Arc<Fake>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Default)]
struct Fake {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    keys: HashMap<String, KeyState>,
    /// Executions per key (charges made).
    executions: HashMap<String, u64>,
    /// Requests per key, repeats included.
    requests: HashMap<String, u64>,
    /// Every PaymentIntent made, in order.
    intents: Vec<Value>,
    faults: VecDeque<Fault>,
    searches: u64,
    /// Searches still to answer 500.
    failing_searches: u64,
    authorizations: Vec<String>,
    forms: Vec<Vec<(String, String)>>,
    /// Every Refund made, in order.
    refunds: Vec<Value>,
    /// Refund lists received.
    refund_lists: u64,
}

enum KeyState {
    InProgress,
    Saved {
        params: Vec<(String, String)>,
        status: u16,
        body: Value,
    },
}

impl StripeFake {
    pub async fn start() -> StripeFake {
        StripeFake::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    pub async fn start_on(addr: SocketAddr) -> StripeFake {
        let state = Arc::new(Fake::default());
        let app = Router::new()
            .route("/v1/payment_intents", post(create))
            .route("/v1/payment_intents/search", get(search))
            .route("/v1/refunds", post(refund).get(list_refunds))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("an address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        StripeFake {
            addr,
            state,
            _stop: stop,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues `fault` for the next execution not yet faulted.
    pub fn fail_next(&self, fault: Fault) {
        self.state.lock().faults.push_back(fault);
    }

    /// Charges made (executions), all keys.
    pub fn executions(&self) -> u64 {
        self.state.lock().executions.values().sum()
    }

    /// Charges made under `key`.
    pub fn executions_of(&self, key: &str) -> u64 {
        self.state.lock().executions.get(key).copied().unwrap_or(0)
    }

    /// The keys that executed, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.state.lock().executions.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// `POST /v1/payment_intents` requests under `key`, repeats included.
    pub fn requests_of(&self, key: &str) -> u64 {
        self.state.lock().requests.get(key).copied().unwrap_or(0)
    }

    /// The next `n` searches answer 500.
    pub fn fail_searches(&self, n: u64) {
        self.state.lock().failing_searches = n;
    }

    /// Searches received, failed ones included.
    pub fn searches(&self) -> u64 {
        self.state.lock().searches
    }

    /// The PaymentIntents made, in order.
    pub fn intents(&self) -> Vec<Value> {
        self.state.lock().intents.clone()
    }

    /// The `Authorization` headers received, in order.
    pub fn authorizations(&self) -> Vec<String> {
        self.state.lock().authorizations.clone()
    }

    /// The forms received, in order, as (name, value) pairs.
    pub fn forms(&self) -> Vec<Vec<(String, String)>> {
        self.state.lock().forms.clone()
    }

    /// The Refunds made, in order.
    pub fn refunds(&self) -> Vec<Value> {
        self.state.lock().refunds.clone()
    }

    /// `GET /v1/refunds` requests received.
    pub fn refund_lists(&self) -> u64 {
        self.state.lock().refund_lists
    }

    /// Makes a PaymentIntent as another client would, without a key: it is found by the
    /// search like any other.
    pub fn add_intent(&self, intent: Value) {
        self.state.lock().intents.push(intent);
    }
}

impl Fake {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("never poisoned")
    }
}

fn error(status: u16, error: Value) -> Response {
    (
        StatusCode::from_u16(status).expect("a status"),
        axum::Json(json!({ "error": error })),
    )
        .into_response()
}

fn answer(status: u16, body: &Value) -> Response {
    (
        StatusCode::from_u16(status).expect("a status"),
        axum::Json(body.clone()),
    )
        .into_response()
}

fn form(body: &[u8]) -> Vec<(String, String)> {
    let url = reqwest::Url::parse(&format!("http://form/?{}", String::from_utf8_lossy(body)))
        .expect("a form");
    let mut pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
    pairs.sort();
    pairs
}

async fn create(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    idempotent(fake, headers, body, execute).await
}

async fn refund(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    idempotent(fake, headers, body, execute_refund).await
}

/// What a key's first request does: (status, body) from (key, form).
type Execute = fn(&Fake, &str, &[(String, String)]) -> (u16, Value);

/// A request under its Idempotency-Key, as Stripe takes one: `execute` runs on the key's
/// first request only.
async fn idempotent(
    fake: Arc<Fake>,
    headers: HeaderMap,
    body: Bytes,
    execute: Execute,
) -> Response {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if !auth.starts_with("Bearer sk_") {
        return error(
            401,
            json!({"type": "invalid_request_error", "message": "Invalid API Key provided"}),
        );
    }
    let params = form(&body);
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return error(
            400,
            json!({"type": "invalid_request_error", "message": "this fake wants an Idempotency-Key on every charge"}),
        );
    };
    let fault = {
        let mut inner = fake.lock();
        inner.authorizations.push(auth);
        inner.forms.push(params.clone());
        *inner.requests.entry(key.clone()).or_default() += 1;
        match inner.keys.get(&key) {
            Some(KeyState::InProgress) => {
                return error(
                    409,
                    json!({"type": "invalid_request_error", "code": "idempotency_key_in_use", "message": "There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through)"}),
                );
            }
            Some(KeyState::Saved {
                params: first,
                status,
                body,
            }) => {
                if *first != params {
                    return error(
                        400,
                        json!({"type": "idempotency_error", "message": format!("Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '{key}' if you meant to execute a different request.")}),
                    );
                }
                let mut replay = answer(*status, body);
                replay
                    .headers_mut()
                    .insert("idempotent-replayed", "true".parse().unwrap());
                return replay;
            }
            None => {
                inner.keys.insert(key.clone(), KeyState::InProgress);
                inner.faults.pop_front()
            }
        }
    };
    // Released if this request is dropped before it saves its result: Stripe saves
    // nothing for a request that did not execute.
    let mut guard = Unclaim {
        fake: fake.clone(),
        key: key.clone(),
        armed: true,
    };
    if let Some(Fault::DelayExecution(wait)) = fault {
        tokio::time::sleep(wait).await;
    }
    if let Some(Fault::FailBeforeExecuting) = fault {
        drop(guard);
        return error(
            500,
            json!({"type": "api_error", "message": "An unknown error occurred"}),
        );
    }
    let (status, body) = execute(&fake, &key, &params);
    let (status, body) = match fault {
        Some(Fault::Answer500) => (
            500,
            json!({"error": {"type": "api_error", "message": "An unknown error occurred"}}),
        ),
        _ => (status, body),
    };
    fake.lock().keys.insert(
        key,
        KeyState::Saved {
            params,
            status,
            body: body.clone(),
        },
    );
    guard.armed = false;
    match fault {
        Some(Fault::DropAnswer) => {
            // Headers, then a body that fails: the connection is closed mid-answer.
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Body::new(Broken))
                .expect("a response")
        }
        Some(Fault::DelayAnswer(wait)) => {
            tokio::time::sleep(wait).await;
            answer(status, &body)
        }
        _ => answer(status, &body),
    }
}

/// A body whose first frame is an error: hyper closes the connection instead of
/// finishing the answer.
struct Broken;

impl axum::body::HttpBody for Broken {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        std::task::Poll::Ready(Some(Err(std::io::Error::other(
            "the fake drops the connection",
        ))))
    }
}

struct Unclaim {
    fake: Arc<Fake>,
    key: String,
    armed: bool,
}

impl Drop for Unclaim {
    fn drop(&mut self) {
        if self.armed {
            self.fake.lock().keys.remove(&self.key);
        }
    }
}

/// Makes the PaymentIntent, confirmed: the charge.
fn execute(fake: &Fake, key: &str, params: &[(String, String)]) -> (u16, Value) {
    let get = |name: &str| {
        params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut inner = fake.lock();
    *inner.executions.entry(key.to_owned()).or_default() += 1;
    let id = format!("pi_fake{:08}", inner.intents.len() + 1);
    let mut metadata = serde_json::Map::new();
    for (name, value) in params {
        if let Some(field) = name
            .strip_prefix("metadata[")
            .and_then(|n| n.strip_suffix(']'))
        {
            metadata.insert(field.to_owned(), Value::from(value.clone()));
        }
    }
    let method = get("payment_method");
    let (status, last_error) = match method.as_str() {
        "pm_card_visa" => ("succeeded", Value::Null),
        "pm_card_chargeDeclined" => (
            "requires_payment_method",
            json!({"type": "card_error", "code": "card_declined", "decline_code": "generic_decline", "message": "Your card was declined."}),
        ),
        "pm_card_authenticationRequired" => ("requires_action", Value::Null),
        _ => {
            return (
                400,
                json!({"error": {"type": "invalid_request_error", "code": "resource_missing", "message": format!("No such PaymentMethod: '{method}'")}}),
            );
        }
    };
    let intent = json!({
        "id": id,
        "object": "payment_intent",
        "amount": get("amount").parse::<i64>().unwrap_or(0),
        "currency": get("currency"),
        "payment_method": method,
        "status": status,
        "metadata": metadata,
        "last_payment_error": last_error,
    });
    inner.intents.push(intent.clone());
    if status == "requires_payment_method" {
        let mut error = last_error;
        error["payment_intent"] = intent;
        return (402, json!({ "error": error }));
    }
    (200, intent)
}

/// Makes the Refund of a payment intent, never past what is left of its amount.
fn execute_refund(fake: &Fake, key: &str, params: &[(String, String)]) -> (u16, Value) {
    let get = |name: &str| {
        params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut inner = fake.lock();
    let intent_id = get("payment_intent");
    let Some(intent) = inner.intents.iter().find(|i| i["id"] == intent_id.as_str()) else {
        return (
            400,
            json!({"error": {"type": "invalid_request_error", "code": "resource_missing", "message": format!("No such payment_intent: '{intent_id}'")}}),
        );
    };
    let charged = intent["amount"].as_i64().unwrap_or(0);
    let currency = intent["currency"].clone();
    let refunded: i64 = inner
        .refunds
        .iter()
        .filter(|r| r["payment_intent"] == intent_id.as_str())
        .map(|r| r["amount"].as_i64().unwrap_or(0))
        .sum();
    let amount = match get("amount").parse::<i64>() {
        Ok(amount) => amount,
        Err(_) => charged - refunded,
    };
    if refunded >= charged {
        return (
            400,
            json!({"error": {"type": "invalid_request_error", "code": "charge_already_refunded", "message": format!("Charge for payment intent {intent_id} has already been refunded.")}}),
        );
    }
    if refunded + amount > charged {
        return (
            400,
            json!({"error": {"type": "invalid_request_error", "code": "amount_too_large", "message": format!("Refund amount ({amount}) is greater than unrefunded amount on charge ({})", charged - refunded)}}),
        );
    }
    *inner.executions.entry(key.to_owned()).or_default() += 1;
    let mut metadata = serde_json::Map::new();
    for (name, value) in params {
        if let Some(field) = name
            .strip_prefix("metadata[")
            .and_then(|n| n.strip_suffix(']'))
        {
            metadata.insert(field.to_owned(), Value::from(value.clone()));
        }
    }
    let refund = json!({
        "id": format!("re_fake{:08}", inner.refunds.len() + 1),
        "object": "refund",
        "amount": amount,
        "currency": currency,
        "payment_intent": intent_id,
        "status": "succeeded",
        "metadata": metadata,
    });
    inner.refunds.push(refund.clone());
    (200, refund)
}

async fn list_refunds(
    State(fake): State<Arc<Fake>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let mut inner = fake.lock();
    inner.refund_lists += 1;
    let intent = query.get("payment_intent").cloned().unwrap_or_default();
    let data: Vec<Value> = inner
        .refunds
        .iter()
        .filter(|r| r["payment_intent"] == intent.as_str())
        .rev()
        .cloned()
        .collect();
    answer(
        200,
        &json!({"object": "list", "data": data, "has_more": false, "url": "/v1/refunds"}),
    )
}

async fn search(
    State(fake): State<Arc<Fake>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let text = query.get("query").cloned().unwrap_or_default();
    let Some(order) = text
        .strip_prefix("metadata['order_id']:'")
        .and_then(|rest| rest.strip_suffix('\''))
    else {
        return error(
            400,
            json!({"type": "invalid_request_error", "message": format!("this fake searches metadata['order_id'] only, not {text:?}")}),
        );
    };
    let mut inner = fake.lock();
    inner.searches += 1;
    if inner.failing_searches > 0 {
        inner.failing_searches -= 1;
        return error(
            500,
            json!({"type": "api_error", "message": "An unknown error occurred"}),
        );
    }
    let data: Vec<Value> = inner
        .intents
        .iter()
        .filter(|i| i["metadata"]["order_id"] == order)
        .cloned()
        .collect();
    answer(
        200,
        &json!({"object": "search_result", "data": data, "has_more": false}),
    )
}
