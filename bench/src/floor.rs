//! The floor: the I/O a checkout cannot avoid, each part measured bare, in its own
//! process. `floor-axum` serves a bare axum handler (driven by the load generator, its
//! CPU read from /proc like the service's); `floor-reqwest` sends the two
//! chat-completions bodies of a checkout to the scripted model with a bare reqwest
//! client; `floor-sql` runs the bare sqlx charge statement (with `--keyed`, also the
//! Idempotency-Key record's insert and completion). The last two measure their
//! own CPU and print a JSON [`FloorReport`]. `floor-loop` serves a bare handler that
//! makes those two POSTs, for figure 2's memory per waiting loop. With `--wire
//! responses` the two bodies are the Responses API's, as the service writes them with
//! `OPENAI_WIRE_API=responses`, sent to `/responses`.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{SecondsFormat, SubsecRound, Utc};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

use checkout::assistant::{ToolBox, prompts};
use checkout::db::{Conn, Database, PoolSettings};
use checkout::model::WireApi;
use checkout::model::responses;
use checkout::model::wire::{ChatRequest, ChatResponse, Message};
use checkout::payments::{Currency, Effect, Money, Order, OrderId};

use crate::args::Args;
use crate::procfs;

/// An answer the size and shape of the service's 200 to `POST /checkout`.
const CHECKOUT_ANSWER: &str = r#"{"orderId":"c1-0-1","amount":"42.50","currency":"USD","message":"Your payment of 42.50 USD for order c1-0-1 went through; your receipt is 0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b.","receipt":{"id":"0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","orderId":"c1-0-1","amount":"42.50","currency":"USD","createdAt":"2026-01-01T00:00:00.000000Z"},"charged":true,"attempts":1,"operationKey":"0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c"}"#;

/// What `floor-reqwest` and `floor-sql` measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FloorReport {
    /// Operations completed in the measured span (a pair of POSTs, or one statement).
    pub count: u64,
    pub cpu_ms: f64,
    pub wall_ms: f64,
}

impl FloorReport {
    pub fn cpu_per_op_us(&self) -> f64 {
        self.cpu_ms * 1000.0 / self.count.max(1) as f64
    }
}

/// reqwest is built without a TLS provider; the service installs ring, and so do we.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `floor-axum`: a bare axum handler for `POST /checkout`, answering a fixed body.
pub fn axum_main(args: &mut Args) -> Result<(), String> {
    args.done()?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let app = axum::Router::new().route(
            "/checkout",
            axum::routing::post(|| async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    CHECKOUT_ANSWER,
                )
            }),
        );
        println!("floor axum listening on http://{addr}");
        std::io::stdout().flush().map_err(|e| e.to_string())?;
        axum::serve(listener, app).await.map_err(|e| e.to_string())
    })
}

/// `floor-loop --model BASE_URL [--h2c] [--port P] [--wire chat|responses]`: a bare axum handler for `POST
/// /checkout` that sends the two chat-completions bodies of a checkout to the model one
/// after the other with a bare reqwest client (built as the service builds its model
/// client: HTTP/2 with prior knowledge with `--h2c`, as `CHECKOUT_MODEL_H2C=true`), then
/// answers a fixed body: what one checkout waiting on a slow model cannot do without.
/// Figure 2 reads its peak RSS at two concurrencies beside the service's. Served over
/// HTTP/1.1 and HTTP/2 (h2c with prior knowledge) alike.
pub fn loop_main(args: &mut Args) -> Result<(), String> {
    let base = args
        .value("--model")?
        .ok_or("floor-loop: --model is required")?;
    let h2c = args.flag("--h2c");
    let port: u16 = args.number("--port")?.unwrap_or(0);
    let wire = wire(args)?;
    args.done()?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        install_tls_provider();
        let mut builder = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(90));
        if h2c {
            builder = builder.http2_prior_knowledge();
        }
        let client = builder.build().map_err(|e| e.to_string())?;
        let url: Arc<str> = format!("{}{}", base.trim_end_matches('/'), wire.path()).into();
        // Built once (a round trip to the model) and shared: a loop holds no body of its own.
        let (round1, round2) = chat_bodies(&client, &url, wire).await?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let app = axum::Router::new().route(
            "/checkout",
            axum::routing::post(move || {
                let (client, url, round1, round2) =
                    (client.clone(), url.clone(), round1.clone(), round2.clone());
                async move {
                    let answer = async {
                        post(&client, &url, round1).await?;
                        post(&client, &url, round2).await
                    };
                    match answer.await {
                        Ok(_) => (
                            axum::http::StatusCode::OK,
                            [(axum::http::header::CONTENT_TYPE, "application/json")],
                            CHECKOUT_ANSWER.to_owned(),
                        ),
                        Err(err) => (
                            axum::http::StatusCode::BAD_GATEWAY,
                            [(axum::http::header::CONTENT_TYPE, "text/plain")],
                            err,
                        ),
                    }
                }
            }),
        );
        println!("floor loop listening on http://{addr}");
        std::io::stdout().flush().map_err(|e| e.to_string())?;
        axum::serve(listener, app).await.map_err(|e| e.to_string())
    })
}

/// `--wire chat|responses` (chat when not given).
pub fn wire(args: &mut Args) -> Result<WireApi, String> {
    match args.value("--wire")? {
        Some(wire) => WireApi::parse(&wire).map_err(|e| format!("--wire: {e}")),
        None => Ok(WireApi::Chat),
    }
}

/// A request body as the service writes it for `wire`.
fn body_of(chat: &ChatRequest, wire: WireApi) -> Result<Bytes, String> {
    let mut body = Vec::with_capacity(2048);
    match wire {
        WireApi::Chat => serde_json::to_writer(&mut body, chat).map_err(|e| e.to_string())?,
        WireApi::Responses => responses::write_request(chat, &mut body),
    }
    Ok(Bytes::from(body))
}

/// The two request bodies of one checkout: round 1 (charge) and round 2 (confirm),
/// built as the service builds them for `wire`, with the model's real round-1 answer in
/// round 2 (its reasoning items too, on the Responses wire).
async fn chat_bodies(
    client: &reqwest::Client,
    url: &str,
    wire: WireApi,
) -> Result<(Bytes, Bytes), String> {
    let currency = Currency::parse("USD").map_err(|e| e.to_string())?;
    #[allow(
        clippy::disallowed_methods,
        reason = "the floor builds the prompt of a fixed order, as the handler would; it charges nothing"
    )]
    let order = Order::new(
        OrderId::parse("floor-0-1").map_err(|e| e.to_string())?,
        Money::parse("42.50", currency).map_err(|e| e.to_string())?,
    );
    let mut chat = ChatRequest {
        model: "gpt-4o-mini".into(),
        messages: prompts::opening(Effect::Charge, &order, false),
        tools: ToolBox::offered(false),
        max_tokens: Some(checkout::assistant::MAX_TOKENS),
        reasoning_effort: None,
        stream: false,
        stream_options: None,
    };
    let round1 = body_of(&chat, wire)?;
    let answer = post(client, url, round1.clone()).await?;
    let answer: ChatResponse = match wire {
        WireApi::Chat => serde_json::from_slice(&answer).map_err(|e| e.to_string())?,
        WireApi::Responses => {
            let text = std::str::from_utf8(&answer).map_err(|e| e.to_string())?;
            responses::read_answer(text).map_err(|e| e.to_string())?
        }
    };
    let message = answer
        .choices
        .into_iter()
        .next()
        .ok_or("the scripted model's answer has no choices")?
        .message;
    let calls = message.tool_calls.unwrap_or_default();
    let call = calls
        .first()
        .ok_or("the scripted model did not call charge")?;
    let tool_content = serde_json::json!({
        "status": "charged",
        "orderId": "floor-0-1",
        "amount": "42.50",
        "currency": "USD",
        "receiptId": uuid::Uuid::now_v7().to_string(),
        "alreadyCharged": false,
    })
    .to_string();
    let id = call.id.clone();
    chat.messages.push(Message::Assistant {
        reasoning: message.reasoning,
        content: message.content,
        tool_calls: calls,
    });
    chat.messages.push(Message::Tool {
        tool_call_id: id,
        content: tool_content,
    });
    let round2 = body_of(&chat, wire)?;
    Ok((round1, round2))
}

/// One POST as the service's transport sends it: JSON body, answer read whole, not parsed.
async fn post(client: &reqwest::Client, url: &str, body: Bytes) -> Result<Bytes, String> {
    let response = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("the model answered {status}"));
    }
    Ok(body)
}

struct Span {
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
}

impl Span {
    fn parse(args: &mut Args) -> Result<Span, String> {
        Ok(Span {
            concurrency: args.number("--concurrency")?.unwrap_or(64),
            warmup: Duration::from_millis(args.number("--warmup-ms")?.unwrap_or(300)),
            duration: Duration::from_millis(args.number("--duration-ms")?.unwrap_or(2000)),
        })
    }

    /// Runs `op` in `concurrency` loops for the warm-up and then the measured span, and
    /// returns the operations and the CPU time of this process within the measured span.
    async fn measure<F, Fut>(&self, op: F) -> Result<FloorReport, String>
    where
        F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send,
    {
        let ticks = procfs::clock_ticks();
        let op = Arc::new(op);
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for worker in 0..self.concurrency {
            let (op, done, stop) = (op.clone(), done.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    op(worker, n).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), String>(())
            }));
        }
        tokio::time::sleep(self.warmup).await;
        let (count0, cpu0, t0) = (
            done.load(Ordering::Relaxed),
            procfs::cpu_time("self", ticks).map_err(|e| e.to_string())?,
            Instant::now(),
        );
        tokio::time::sleep(self.duration).await;
        let (count1, cpu1, t1) = (
            done.load(Ordering::Relaxed),
            procfs::cpu_time("self", ticks).map_err(|e| e.to_string())?,
            Instant::now(),
        );
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.map_err(|e| e.to_string())??;
        }
        Ok(FloorReport {
            count: count1 - count0,
            cpu_ms: (cpu1 - cpu0).as_secs_f64() * 1000.0,
            wall_ms: (t1 - t0).as_secs_f64() * 1000.0,
        })
    }
}

fn print(report: &FloorReport) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, report).map_err(|e| e.to_string())?;
    writeln!(stdout).map_err(|e| e.to_string())
}

/// `floor-reqwest --model BASE_URL [--hyper]`: pairs of bare POSTs (round 1, round 2),
/// by reqwest (the floor issue 22 set), or with `--hyper` by hyper's pooled client, which
/// reqwest wraps and the service has used since (a reference row beside the floor).
pub fn reqwest_main(args: &mut Args) -> Result<(), String> {
    let base = args
        .value("--model")?
        .ok_or("floor-reqwest: --model is required")?;
    let hyper = args.flag("--hyper");
    let wire = wire(args)?;
    let span = Span::parse(args)?;
    args.done()?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let report = runtime.block_on(async move {
        install_tls_provider();
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| e.to_string())?;
        let url: Arc<str> = format!("{}{}", base.trim_end_matches('/'), wire.path()).into();
        let (round1, round2) = chat_bodies(&client, &url, wire).await?;
        if hyper {
            let mut tcp = HttpConnector::new();
            tcp.set_nodelay(true);
            let client: HyperClient<_, Full<Bytes>> =
                HyperClient::builder(TokioExecutor::new()).build(tcp);
            let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
            return span
                .measure(move |_, _| {
                    let (client, uri, bodies) = (
                        client.clone(),
                        uri.clone(),
                        [&round1, &round2].map(Bytes::clone),
                    );
                    async move {
                        for body in bodies {
                            let request = hyper::Request::post(uri.clone())
                                .header(hyper::header::CONTENT_TYPE, "application/json")
                                .body(Full::new(body))
                                .map_err(|e| e.to_string())?;
                            let response =
                                client.request(request).await.map_err(|e| e.to_string())?;
                            if !response.status().is_success() {
                                return Err(format!("the model answered {}", response.status()));
                            }
                            response
                                .into_body()
                                .collect()
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                        Ok(())
                    }
                })
                .await;
        }
        span.measure(move |_, _| {
            let (client, url, round1, round2) =
                (client.clone(), url.clone(), round1.clone(), round2.clone());
            async move {
                post(&client, &url, round1).await?;
                post(&client, &url, round2).await?;
                Ok(())
            }
        })
        .await
    })?;
    print(&report)
}

const PG_INSERT: &str = "\
    INSERT INTO receipts (id, order_id, amount_minor, currency, operation_key, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6) \
    ON CONFLICT (order_id) DO NOTHING \
    RETURNING id, order_id, amount_minor, currency, operation_key, created_at";

const SQLITE_INSERT: &str = "\
    INSERT INTO receipts (id, order_id, amount_minor, currency, operation_key, created_at) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
    ON CONFLICT (order_id) DO NOTHING \
    RETURNING id, order_id, amount_minor, currency, operation_key, created_at";

/// A keyed checkout's record, as the service inserts it (src/idempotency/records.rs): one
/// text for both databases, timed by their `clock` view.
const RECORD_INSERT: &str = "\
    INSERT INTO idempotency_keys (scope, key, fingerprint, fence, lease_until, created_at, expires_at, request) \
    SELECT $1, $2, $3, 1, now_ms + $4, now_ms, now_ms + $5, $6 FROM clock WHERE true \
    ON CONFLICT (scope, key) DO NOTHING RETURNING fence";

/// Its completion: the answer saved under the fence the insert gave.
const RECORD_COMPLETE: &str = "\
    UPDATE idempotency_keys SET status = $4, content_type = $5, body = $6, lease_until = NULL \
    WHERE scope = $1 AND key = $2 AND fence = $3 AND status IS NULL";

/// `floor-sql --database URL --prefix P [--keyed]`: the bare charge statement, a fresh
/// order each time, one statement and one commit, on a database opened by the service's
/// own code (`--pool N`: the Postgres pool size, as `CHECKOUT_DB_MAX_CONNECTIONS`). On
/// SQLite the service does better than this, grouping the charges that arrive together
/// into one commit (src/payments/store/group.rs). With `--keyed`, what a checkout with
/// an `Idempotency-Key` cannot do without besides: its record inserted before the charge
/// and completed with the answer after it, each a statement and a commit of its own.
pub fn sql_main(args: &mut Args) -> Result<(), String> {
    let url = args
        .value("--database")?
        .ok_or("floor-sql: --database is required")?;
    let prefix = args.value("--prefix")?.unwrap_or_else(|| "floor".into());
    let keyed = args.flag("--keyed");
    let pool_size: Option<u32> = args.number("--pool")?;
    let span = Span::parse(args)?;
    args.done()?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let report = runtime.block_on(async move {
        let pool = PoolSettings {
            max_connections: pool_size.unwrap_or(16),
            acquire_timeout: Duration::from_secs(2),
        };
        let db = Database::open(&url, &pool)
            .await
            .map_err(|e| e.to_string())?;
        span.measure(move |worker, n| {
            let db = db.clone();
            let order = format!("{prefix}-{worker}-{n}");
            async move {
                if keyed {
                    record(&db, &order, None).await?;
                }
                let mut conn = db.acquire().await.map_err(|e| e.to_string())?;
                let (id, operation, at) = (
                    uuid::Uuid::now_v7(),
                    uuid::Uuid::now_v7(),
                    Utc::now().trunc_subsecs(6),
                );
                match conn.conn() {
                    Conn::Postgres(c) => sqlx::query(PG_INSERT)
                        .bind(id)
                        .bind(order.as_str())
                        .bind(4250_i64)
                        .bind("USD")
                        .bind(operation.to_string())
                        .bind(at)
                        .fetch_optional(c)
                        .await
                        .map(drop),
                    Conn::Sqlite(c) => sqlx::query(SQLITE_INSERT)
                        .bind(id.to_string())
                        .bind(order.as_str())
                        .bind(4250_i64)
                        .bind("USD")
                        .bind(operation.to_string())
                        .bind(at.to_rfc3339_opts(SecondsFormat::Micros, true))
                        .fetch_optional(c)
                        .await
                        .map(drop),
                }
                .map_err(|e| e.to_string())?;
                drop(conn);
                if keyed {
                    record(&db, &order, Some(CHECKOUT_ANSWER)).await?;
                }
                Ok(())
            }
        })
        .await
    })?;
    print(&report)
}

/// The keyed floor's record statements: the insert (`answer` `None`), or the completion
/// with `answer`, each on a connection of its own from the pool, as the service takes one.
async fn record(db: &Database, key: &str, answer: Option<&str>) -> Result<(), String> {
    const REQUEST: &str = r#"{"orderId":"c1-0-1","amount":"42.50","currency":"USD"}"#;
    let fingerprint = format!("POST /checkout orderId={key} amount=4250 currency=USD");
    let mut conn = db.acquire().await.map_err(|e| e.to_string())?;
    let done = match (answer, conn.conn()) {
        (None, Conn::Postgres(c)) => sqlx::query(RECORD_INSERT)
            .bind("")
            .bind(key)
            .bind(fingerprint)
            .bind(10_000_i64)
            .bind(86_400_000_i64)
            .bind(REQUEST)
            .fetch_optional(c)
            .await
            .map(|row| row.is_some()),
        (None, Conn::Sqlite(c)) => sqlx::query(RECORD_INSERT)
            .bind("")
            .bind(key)
            .bind(fingerprint)
            .bind(10_000_i64)
            .bind(86_400_000_i64)
            .bind(REQUEST)
            .fetch_optional(c)
            .await
            .map(|row| row.is_some()),
        (Some(body), Conn::Postgres(c)) => sqlx::query(RECORD_COMPLETE)
            .bind("")
            .bind(key)
            .bind(1_i64)
            .bind(200_i64)
            .bind("application/json")
            .bind(body.as_bytes())
            .execute(c)
            .await
            .map(|done| done.rows_affected() == 1),
        (Some(body), Conn::Sqlite(c)) => sqlx::query(RECORD_COMPLETE)
            .bind("")
            .bind(key)
            .bind(1_i64)
            .bind(200_i64)
            .bind("application/json")
            .bind(body.as_bytes())
            .execute(c)
            .await
            .map(|done| done.rows_affected() == 1),
    }
    .map_err(|e| e.to_string())?;
    if !done {
        return Err(format!("the record of {key} was not written"));
    }
    Ok(())
}
