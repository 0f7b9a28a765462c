//! `checkout-bench --real-model`: the service against a real OpenAI-compatible server.
//!
//! Forty orders with varied ids and amounts go through the service, one or two at a time,
//! to a real model (by default the llama.cpp server that `../shared/llm/start.sh 18080`
//! starts, with its default sampling). Between the service and the model sits a counting
//! proxy of the benchmark's own, which attributes each chat-completions request to its
//! order (by the order id in the conversation's first user message) and records its
//! round and the provider's token counts. Afterwards the receipts table is read: an order
//! is charged exactly when it was answered 200 and has one receipt, of its amount and
//! currency. Target: >= 95 % charged exactly; 0 wrong or double charges.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Connection;

use crate::args::Args;
use crate::bench;
use crate::child;

/// The orders: ids of letters, digits and `. _ : -` up to 64 characters; amounts from
/// 0.01 to 99,999.99 (with the ones floats get wrong); USD, EUR and JPY.
const ORDERS: [(&str, &str, &str); 40] = [
    ("A-100", "42.50", "USD"),
    ("X.1:2", "19.99", "USD"),
    ("ord_7f3a", "0.29", "EUR"),
    ("B2-9.4:x_1", "1.15", "USD"),
    ("Z", "4.35", "EUR"),
    ("inv-2026-12-03-0001", "1500", "JPY"),
    ("k:9", "0.01", "USD"),
    ("Q.Q.Q", "99999.99", "USD"),
    ("a1_b2-c3.d4:e5", "7", "EUR"),
    (
        "ORDER-0000000000000000000000000000000000000000000000000000000001",
        "120.00",
        "USD",
    ),
    ("cart:42:line:7", "3.10", "EUR"),
    ("9", "980", "JPY"),
    ("po.2026.0042", "250.00", "USD"),
    ("user_18-order_3", "12.34", "EUR"),
    ("SKU-AB12.cd34", "5.05", "USD"),
    ("x-y-z", "64.00", "EUR"),
    ("M-1", "1", "JPY"),
    ("2026:12:03", "88.80", "USD"),
    ("a.b_c-d:e", "0.99", "EUR"),
    (
        "LONG.ORDER.ID.WITH.MANY.PARTS.AND.DIGITS.1234567890.abcdef",
        "45678.90",
        "USD",
    ),
    ("t_1", "33.33", "EUR"),
    ("R-2D2", "2500", "JPY"),
    ("c3po:7", "19.99", "EUR"),
    ("ord-0001", "10.00", "USD"),
    ("ord-0002", "10.01", "USD"),
    ("batch.7_item-3", "76.50", "EUR"),
    ("Y", "99999", "JPY"),
    ("abc123", "1.15", "EUR"),
    ("w:w:w", "4.35", "USD"),
    ("N-42.1", "0.29", "USD"),
    ("gift_card-9", "50.00", "EUR"),
    ("e.commerce-2026", "149.99", "USD"),
    ("UPPER_lower-123", "300", "JPY"),
    ("s:1.2_3-4", "8.00", "EUR"),
    ("HX-4471-B", "1234.56", "USD"),
    ("fin.q4:close", "0.50", "EUR"),
    ("z9-y8_x7.w6:v5", "42", "JPY"),
    ("order.last", "9999.99", "USD"),
    ("TKT_2026_000123", "15.75", "EUR"),
    ("end-40", "19.99", "USD"),
];

const USAGE: &str = "\
usage: checkout-bench --real-model [--model-url URL] [--model-name NAME] [--orders N]
                      [--concurrency N] [--db sqlite|postgres] [--out DIR] [--work DIR]
                      [--service-env NAME=VALUE]... [--service-bin PATH] [--no-build]

Runs N (default and at most 40) checkouts through the service against a real
OpenAI-compatible server (default http://127.0.0.1:18080/v1, model qwen2.5-coder-0.5b:
start it with ../shared/llm/setup.sh && ../shared/llm/start.sh 18080). Writes
DIR/real-model.json and DIR/real-model.md (DIR as for the benchmark: --out, else bench/
under cargo, else the current directory).";

/// One checkout as the client and the proxy saw it.
#[derive(Clone, Debug, Default, Serialize)]
struct Checkout {
    order_id: String,
    amount: String,
    currency: String,
    status: u16,
    code: Option<String>,
    latency_ms: f64,
    /// Chat-completions requests the proxy forwarded for this order.
    model_requests: u32,
    /// The highest round of any of them (1 = the first request of a loop attempt).
    rounds: u32,
    input_tokens: u64,
    output_tokens: u64,
    receipts: u32,
    charged_exactly: bool,
}

#[derive(Default)]
struct Seen {
    model_requests: u32,
    rounds: u32,
    input_tokens: u64,
    output_tokens: u64,
}

struct Proxy {
    upstream: String,
    http: reqwest::Client,
    seen: Mutex<HashMap<String, Seen>>,
}

pub fn main(args: &mut Args) -> Result<(), String> {
    if args.flag("--help") || args.flag("-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let command_line: Vec<String> = std::env::args().collect();
    let model_url = args
        .value("--model-url")?
        .unwrap_or_else(|| "http://127.0.0.1:18080/v1".into());
    let model_name = args
        .value("--model-name")?
        .unwrap_or_else(|| "qwen2.5-coder-0.5b".into());
    let count = args.number::<usize>("--orders")?.unwrap_or(ORDERS.len());
    if !(1..=ORDERS.len()).contains(&count) {
        return Err(format!("--orders: 1 to {}", ORDERS.len()));
    }
    let concurrency = args.number::<usize>("--concurrency")?.unwrap_or(2).max(1);
    let db_name = args.value("--db")?.unwrap_or_else(|| "sqlite".into());
    let mut service_env = Vec::new();
    for pair in args.values("--service-env")? {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("--service-env {pair:?}: expected NAME=VALUE"))?;
        service_env.push((name.to_owned(), value.to_owned()));
    }
    let places = bench::Places::parse(args)?;
    args.done()?;

    let env = bench::environment(places)?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let database_url = match db_name.as_str() {
        "sqlite" => format!("sqlite://{}", env.work.join("real-model.db").display()),
        "postgres" => {
            bench::postgres_db(&rt, "postgres://postgres@127.0.0.1:5432", bench::DB_NAME)?
                .service_url
        }
        other => return Err(format!("--db: unknown database {other:?}")),
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let proxy = Arc::new(Proxy {
        upstream: format!("{}/chat/completions", model_url.trim_end_matches('/')),
        http: reqwest::Client::new(),
        seen: Mutex::new(HashMap::new()),
    });
    let proxy_addr = rt.block_on(serve_proxy(proxy.clone()))?;

    // A slow machine's model: generous timeouts, the retry layers at their defaults.
    let mut extra: Vec<(String, String)> = vec![
        ("OPENAI_API_KEY".into(), "none".into()),
        ("OPENAI_MODEL".into(), model_name.clone()),
        ("CHECKOUT_REQUEST_TIMEOUT_MS".into(), "120000".into()),
        ("CHECKOUT_LOOP_TIMEOUT_MS".into(), "300000".into()),
        ("CHECKOUT_SERVER_TIMEOUT_MS".into(), "1000000".into()),
    ];
    extra.extend(service_env.iter().cloned());
    let service = child::service(
        &env,
        "service-real-model",
        &database_url,
        &format!("http://{proxy_addr}/v1"),
        &extra,
    )?;
    let orders: Vec<(String, String, String)> = ORDERS[..count]
        .iter()
        .map(|(id, amount, currency)| (id.to_string(), amount.to_string(), currency.to_string()))
        .collect();
    eprintln!(
        "checkout-bench: {count} checkouts against {model_url} ({model_name}), {concurrency} at a time"
    );
    let started = Instant::now();
    let mut checkouts = rt.block_on(run_orders(&service.url, &orders, concurrency))?;
    let wall = started.elapsed();
    service.stop();

    let receipts = rt.block_on(read_receipts(&database_url))?;
    let seen = std::mem::take(&mut *proxy.seen.lock().unwrap());
    let known: HashMap<&str, (&str, &str)> = orders
        .iter()
        .map(|(id, amount, currency)| (id.as_str(), (amount.as_str(), currency.as_str())))
        .collect();
    let mut wrong = 0;
    let mut by_order: HashMap<&str, u32> = HashMap::new();
    for (order_id, minor, currency) in &receipts {
        *by_order.entry(order_id.as_str()).or_default() += 1;
        let exact = known
            .get(order_id.as_str())
            .is_some_and(|(amount, cur)| *cur == currency && minor_of(amount, cur) == Some(*minor));
        if !exact {
            wrong += 1;
        }
    }
    let double = by_order.values().filter(|n| **n > 1).count();
    for c in &mut checkouts {
        if let Some(s) = seen.get(&c.order_id) {
            c.model_requests = s.model_requests;
            c.rounds = s.rounds;
            c.input_tokens = s.input_tokens;
            c.output_tokens = s.output_tokens;
        }
        c.receipts = by_order.get(c.order_id.as_str()).copied().unwrap_or(0);
        let receipt_exact = receipts.iter().any(|(id, minor, cur)| {
            *id == c.order_id && *cur == c.currency && minor_of(&c.amount, cur) == Some(*minor)
        });
        c.charged_exactly = c.status == 200 && c.receipts == 1 && receipt_exact;
    }
    let report = summarize(&checkouts, wrong, double, wall);
    let machine = crate::procfs::machine();
    let text = render(
        &report,
        &checkouts,
        &model_url,
        &model_name,
        &machine,
        &command_line,
    );
    println!("{text}");
    std::fs::create_dir_all(&env.out).map_err(|e| e.to_string())?;
    std::fs::write(env.out.join("real-model.md"), &text).map_err(|e| e.to_string())?;
    let detail = json!({
        "command": command_line.join(" "),
        "machine": machine,
        "model_url": model_url,
        "model": model_name,
        "database": db_name,
        "summary": report,
        "checkouts": checkouts,
    });
    std::fs::write(
        env.out.join("real-model.json"),
        serde_json::to_string_pretty(&detail).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    if report.charged_exactly_share >= 0.95 && wrong == 0 && double == 0 {
        Ok(())
    } else {
        Err("the real-model target (>= 95 % charged exactly, 0 wrong or double) was missed".into())
    }
}

/// Minor units of a decimal amount in a currency with this many digits.
fn minor_of(amount: &str, currency: &str) -> Option<i64> {
    let currency = checkout::payments::Currency::parse(currency).ok()?;
    checkout::payments::Money::parse(amount, currency)
        .ok()
        .map(|m| m.minor())
}

async fn serve_proxy(proxy: Arc<Proxy>) -> Result<SocketAddr, String> {
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(forward))
        .with_state(proxy);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// Forwards one chat-completions request and notes it against its order.
async fn forward(
    State(proxy): State<Arc<Proxy>>,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let first_user = messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    let round = 1 + messages.iter().filter(|m| m["role"] == "assistant").count() as u32;
    // The known id the user message names as a whole word ("X.1:2", not "X.1"; "Y", not
    // the Y of "JPY").
    let order = ORDERS
        .iter()
        .map(|(id, _, _)| *id)
        .filter(|id| names_whole(&first_user, id))
        .max_by_key(|id| id.len())
        .unwrap_or("?")
        .to_owned();
    let mut upstream = proxy.http.post(&proxy.upstream).body(body);
    if let Some(auth) = headers.get(axum::http::header::AUTHORIZATION) {
        upstream = upstream.header(axum::http::header::AUTHORIZATION, auth);
    }
    upstream = upstream.header(axum::http::header::CONTENT_TYPE, "application/json");
    let (status, answer) = match upstream.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.bytes().await.unwrap_or_default())
        }
        Err(err) => (
            502,
            Bytes::from(json!({"error": {"message": err.to_string()}}).to_string()),
        ),
    };
    let usage: Value =
        serde_json::from_slice::<Value>(&answer).unwrap_or_default()["usage"].clone();
    {
        let mut seen = proxy.seen.lock().unwrap();
        let s = seen.entry(order).or_default();
        s.model_requests += 1;
        s.rounds = s.rounds.max(round);
        s.input_tokens += usage["prompt_tokens"].as_u64().unwrap_or(0);
        s.output_tokens += usage["completion_tokens"].as_u64().unwrap_or(0);
    }
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        answer,
    )
}

/// Whether `text` has `id` with no order-id character on either side.
fn names_whole(text: &str, id: &str) -> bool {
    let part_of_id = |c: char| c.is_ascii_alphanumeric() || "._:-".contains(c);
    text.match_indices(id).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + id.len()..].chars().next();
        !before.is_some_and(part_of_id) && !after.is_some_and(|c| part_of_id(c) && c != '.')
    })
}

async fn run_orders(
    service_url: &str,
    orders: &[(String, String, String)],
    concurrency: usize,
) -> Result<Vec<Checkout>, String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1200))
        .build()
        .map_err(|e| e.to_string())?;
    let limit = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = Vec::new();
    for (id, amount, currency) in orders.iter().cloned() {
        let http = http.clone();
        let limit = limit.clone();
        let url = format!("{}/checkout", service_url.trim_end_matches('/'));
        tasks.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.expect("never closed");
            let started = Instant::now();
            // Order ids, amounts and currency codes need no escaping in a query.
            let answer = http
                .post(format!(
                    "{url}?orderId={id}&amount={amount}&currency={currency}"
                ))
                .send()
                .await;
            let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
            let (status, body) = match answer {
                Ok(r) => (
                    r.status().as_u16(),
                    r.json::<Value>().await.unwrap_or_default(),
                ),
                Err(err) => (0, json!({"code": err.to_string()})),
            };
            eprintln!(
                "  {id:<24} {amount:>9} {currency}: {status} {} in {:.1} s",
                body["code"].as_str().unwrap_or(""),
                latency_ms / 1000.0
            );
            Checkout {
                order_id: id,
                amount,
                currency,
                status,
                code: body["code"].as_str().map(str::to_owned),
                latency_ms,
                ..Checkout::default()
            }
        }));
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// Every receipt: order id, minor units, currency.
async fn read_receipts(url: &str) -> Result<Vec<(String, i64, String)>, String> {
    const SELECT: &str = "SELECT order_id, amount_minor, currency FROM receipts";
    if url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query_as(SELECT)
            .fetch_all(&mut conn)
            .await
            .map_err(|e| e.to_string())
    } else {
        let mut conn = sqlx::SqliteConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query_as(SELECT)
            .fetch_all(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }
}

#[derive(Debug, Serialize)]
struct Summary {
    checkouts: usize,
    charged_exactly: usize,
    charged_exactly_share: f64,
    wrong_charges: usize,
    double_charges: usize,
    rounds_per_checkout: f64,
    model_requests_per_checkout: f64,
    input_tokens_per_checkout: f64,
    output_tokens_per_checkout: f64,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
    wall_seconds: f64,
    failures: HashMap<String, usize>,
}

fn summarize(checkouts: &[Checkout], wrong: usize, double: usize, wall: Duration) -> Summary {
    let n = checkouts.len();
    let mean = |f: &dyn Fn(&Checkout) -> f64| checkouts.iter().map(f).sum::<f64>() / n as f64;
    let mut latencies: Vec<f64> = checkouts.iter().map(|c| c.latency_ms).collect();
    latencies.sort_by(f64::total_cmp);
    let pick = |q: f64| latencies[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    let exact = checkouts.iter().filter(|c| c.charged_exactly).count();
    let mut failures = HashMap::new();
    for c in checkouts.iter().filter(|c| !c.charged_exactly) {
        let what = format!("{} {}", c.status, c.code.as_deref().unwrap_or("-"));
        *failures.entry(what).or_default() += 1;
    }
    Summary {
        checkouts: n,
        charged_exactly: exact,
        charged_exactly_share: exact as f64 / n as f64,
        wrong_charges: wrong,
        double_charges: double,
        rounds_per_checkout: mean(&|c| f64::from(c.rounds)),
        model_requests_per_checkout: mean(&|c| f64::from(c.model_requests)),
        input_tokens_per_checkout: mean(&|c| c.input_tokens as f64),
        output_tokens_per_checkout: mean(&|c| c.output_tokens as f64),
        latency_p50_ms: pick(0.50),
        latency_p99_ms: pick(0.99),
        wall_seconds: wall.as_secs_f64(),
        failures,
    }
}

fn render(
    s: &Summary,
    checkouts: &[Checkout],
    model_url: &str,
    model: &str,
    machine: &str,
    command_line: &[String],
) -> String {
    let mark = |ok: bool| if ok { "met" } else { "MISSED" };
    let mut failures: Vec<String> = s
        .failures
        .iter()
        .map(|(k, v)| format!("{v} × {k}"))
        .collect();
    failures.sort();
    let mut out = format!(
        "## Real model: {model} at {model_url}\n\n\
         `{}` — {machine}, {:.0} s\n\n\
         | figure | value | target |\n|---|---|---|\n\
         | charged exactly | {}/{} = {:.1} % | >= 95 % ({}) |\n\
         | wrong charges | {} | = 0 ({}) |\n\
         | double charges | {} | = 0 ({}) |\n\
         | rounds per checkout (mean of the highest round) | {:.2} | |\n\
         | model requests per checkout | {:.2} | |\n\
         | input / output tokens per checkout | {:.0} / {:.0} | |\n\
         | latency p50 / p99 | {:.1} s / {:.1} s | |\n\
         | not charged exactly | {} | |\n\n",
        command_line.join(" "),
        s.wall_seconds,
        s.charged_exactly,
        s.checkouts,
        s.charged_exactly_share * 100.0,
        mark(s.charged_exactly_share >= 0.95),
        s.wrong_charges,
        mark(s.wrong_charges == 0),
        s.double_charges,
        mark(s.double_charges == 0),
        s.rounds_per_checkout,
        s.model_requests_per_checkout,
        s.input_tokens_per_checkout,
        s.output_tokens_per_checkout,
        s.latency_p50_ms / 1000.0,
        s.latency_p99_ms / 1000.0,
        if failures.is_empty() {
            "none".into()
        } else {
            failures.join(", ")
        },
    );
    out.push_str(
        "| order | amount | status | requests | rounds | receipts |\n|---|---|---|---|---|---|\n",
    );
    for c in checkouts {
        out.push_str(&format!(
            "| `{}` | {} {} | {} {} | {} | {} | {} |\n",
            c.order_id,
            c.amount,
            c.currency,
            c.status,
            c.code.as_deref().unwrap_or(""),
            c.model_requests,
            c.rounds,
            c.receipts
        ));
    }
    out
}
