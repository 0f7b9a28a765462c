//! The load generator: `checkout-bench load ...`, its own process, so that its CPU is
//! never the service's. Closed loop: each of `concurrency` workers sends a checkout,
//! waits for the answer, sends the next. Prints one JSON [`LoadReport`] on stdout.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::args::Args;
use crate::procfs;
use crate::sse::{Streamed, is_event_stream, read_stream, stream_report};

pub use crate::sse::StreamReport;

/// HTTP/2 streams the load generator opens on one connection (hyper's server allows 200).
const STREAMS_PER_CONNECTION: usize = 100;

#[derive(Clone, Debug)]
pub struct LoadArgs {
    /// `http://ADDR` of the service (or of a floor server).
    pub url: String,
    pub concurrency: usize,
    /// Run until this long after the start, then send no new request.
    pub duration_ms: Option<u64>,
    /// Or: send exactly this many requests in all.
    pub requests: Option<u64>,
    /// Worker `w` starts `ramp_ms * w / concurrency` after the start.
    pub ramp_ms: u64,
    /// Throughput and latency count the requests that end in
    /// [`window_start_ms`, `duration_ms`] (the whole run without a duration).
    pub window_start_ms: u64,
    /// Order ids are `{prefix}-{worker}-{n}` (or `{prefix}-{n}` with `requests`).
    pub prefix: String,
    pub amount: String,
    /// HTTP/2 with prior knowledge (many checkouts on few connections).
    pub http2: bool,
    /// Writes `orderId<TAB>status<TAB>receiptId<TAB>attempts<TAB>inputTokens<TAB>outputTokens<TAB>approvalId`
    /// per request here (`-` where the answer has none).
    pub records: Option<PathBuf>,
    pub timeout_ms: u64,
    /// A worker answered 503 or 429 with `Retry-After` waits that long before its next
    /// request (as a well-behaved client does), within the run's duration.
    pub honor_retry_after: bool,
    /// Each request carries an `Idempotency-Key`: its order id, fresh per request.
    pub keyed: bool,
    /// Instead of checkouts: `POST /approvals/{id}/approve` for each approval id in this
    /// file (one a line), each once (figure 11). Records are then
    /// `approvalId<TAB>status<TAB>orderId<TAB>receiptId<TAB>charged`.
    pub approve: Option<PathBuf>,
    /// Each checkout asks for its events (`Accept: text/event-stream`) and reads the
    /// stream to its end (figure 12): the answer is the last event's.
    pub stream: bool,
}

impl LoadArgs {
    pub fn new(url: &str, concurrency: usize, prefix: &str) -> LoadArgs {
        LoadArgs {
            url: url.to_owned(),
            concurrency,
            duration_ms: None,
            requests: None,
            ramp_ms: 0,
            window_start_ms: 0,
            prefix: prefix.to_owned(),
            amount: "42.50".into(),
            http2: false,
            records: None,
            timeout_ms: 120_000,
            honor_retry_after: false,
            keyed: false,
            approve: None,
            stream: false,
        }
    }

    pub fn parse(args: &mut Args) -> Result<LoadArgs, String> {
        let url = args.value("--url")?.ok_or("load: --url is required")?;
        let concurrency = args.number("--concurrency")?.unwrap_or(64);
        let mut load = LoadArgs::new(&url, concurrency as usize, "load");
        load.duration_ms = args.number("--duration-ms")?;
        load.requests = args.number("--requests")?;
        load.ramp_ms = args.number("--ramp-ms")?.unwrap_or(0);
        load.window_start_ms = args.number("--window-start-ms")?.unwrap_or(0);
        if let Some(prefix) = args.value("--prefix")? {
            load.prefix = prefix;
        }
        if let Some(amount) = args.value("--amount")? {
            load.amount = amount;
        }
        load.http2 = args.flag("--http2");
        load.records = args.value("--records")?.map(PathBuf::from);
        load.timeout_ms = args.number("--timeout-ms")?.unwrap_or(120_000);
        load.honor_retry_after = args.flag("--honor-retry-after");
        load.keyed = args.flag("--keyed");
        load.approve = args.value("--approve")?.map(PathBuf::from);
        load.stream = args.flag("--stream");
        if load.duration_ms.is_none() == load.requests.is_none() {
            return Err("load: give exactly one of --duration-ms and --requests".into());
        }
        Ok(load)
    }

    /// The command-line arguments that [`LoadArgs::parse`] reads back.
    pub fn to_args(&self) -> Vec<String> {
        let mut out = vec![
            "load".to_owned(),
            "--url".into(),
            self.url.clone(),
            "--concurrency".into(),
            self.concurrency.to_string(),
            "--ramp-ms".into(),
            self.ramp_ms.to_string(),
            "--window-start-ms".into(),
            self.window_start_ms.to_string(),
            "--prefix".into(),
            self.prefix.clone(),
            "--amount".into(),
            self.amount.clone(),
            "--timeout-ms".into(),
            self.timeout_ms.to_string(),
        ];
        if let Some(d) = self.duration_ms {
            out.extend(["--duration-ms".into(), d.to_string()]);
        }
        if let Some(n) = self.requests {
            out.extend(["--requests".into(), n.to_string()]);
        }
        if self.http2 {
            out.push("--http2".into());
        }
        if self.honor_retry_after {
            out.push("--honor-retry-after".into());
        }
        if self.keyed {
            out.push("--keyed".into());
        }
        if let Some(path) = &self.records {
            out.extend(["--records".into(), path.display().to_string()]);
        }
        if let Some(path) = &self.approve {
            out.extend(["--approve".into(), path.display().to_string()]);
        }
        if self.stream {
            out.push("--stream".into());
        }
        out
    }
}

/// Latency figures in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Percentiles {
    pub n: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(mut values_us: Vec<u64>) -> Percentiles {
        if values_us.is_empty() {
            return Percentiles::default();
        }
        values_us.sort_unstable();
        let n = values_us.len();
        // Nearest rank: the smallest value with at least q of the values at or below it.
        let at = |q: f64| {
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
            values_us[rank - 1] as f64 / 1000.0
        };
        Percentiles {
            n: n as u64,
            mean: values_us.iter().sum::<u64>() as f64 / n as f64 / 1000.0,
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: values_us[n - 1] as f64 / 1000.0,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LoadReport {
    pub sent: u64,
    /// Answers 200.
    pub ok: u64,
    /// Answers by status; `error` for a request that got no answer.
    pub statuses: BTreeMap<String, u64>,
    /// Answers by status and the `code` of a problem body: `200`, `503 overloaded`,
    /// `503 unavailable`, `502 model_unavailable`...; a non-200 answer without a code is
    /// its status alone; `error` for no answer.
    #[serde(default)]
    pub answers: BTreeMap<String, u64>,
    /// Latency of the requests that ended within the window, by answer (the keys of
    /// `answers`): admitted checkouts (`200`) apart from refused ones (`503 overloaded`).
    #[serde(default)]
    pub window_latency_by_answer: BTreeMap<String, Percentiles>,
    /// Requests that waited a `Retry-After` before their next (`--honor-retry-after`).
    #[serde(default)]
    pub retry_after_waits: u64,
    /// The first few distinct failures, for the log.
    pub errors: Vec<String>,
    pub wall_ms: f64,
    pub window_ms: f64,
    /// Requests answered 200 within the window.
    pub window_ok: u64,
    /// Latency of the requests that ended within the window.
    pub window_latency: Percentiles,
    pub latency: Percentiles,
    pub max_in_flight: u64,
    /// The load generator's own CPU time.
    pub cpu_ms: f64,
    /// With `--stream`: what the event streams delivered.
    #[serde(default)]
    pub stream: Option<StreamReport>,
}

pub(crate) struct Sample {
    pub(crate) start_us: u64,
    end_us: u64,
    /// `--stream`: when its first event came, how many it got, how it ended.
    pub(crate) stream: Option<Streamed>,
    status: u16,
    /// The problem body's `code`, for an answer other than 200 that has one.
    code: Option<String>,
}

impl Sample {
    /// The key of [`LoadReport::answers`].
    fn answer(&self) -> String {
        match (self.status, &self.code) {
            (0, _) => "error".to_owned(),
            (status, Some(code)) => format!("{status} {code}"),
            (status, None) => status.to_string(),
        }
    }
}

pub fn main(args: &mut Args) -> Result<(), String> {
    let load = LoadArgs::parse(args)?;
    args.done()?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let report = runtime.block_on(run(load))?;
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, &report).map_err(|e| e.to_string())?;
    writeln!(stdout).map_err(|e| e.to_string())
}

async fn run(load: LoadArgs) -> Result<LoadReport, String> {
    let ticks = procfs::clock_ticks();
    let cpu_before = procfs::cpu_time("self", ticks).map_err(|e| e.to_string())?;
    crate::floor::install_tls_provider();
    // HTTP/1.1: one connection per worker. HTTP/2: a client (a connection) per
    // STREAMS_PER_CONNECTION workers, under the server's limit of concurrent streams, as
    // a load balancer's upstream pool would spread them.
    let clients = if load.http2 {
        load.concurrency.div_ceil(STREAMS_PER_CONNECTION).max(1)
    } else {
        1
    };
    let clients = (0..clients)
        .map(|_| {
            let builder = reqwest::Client::builder()
                .no_proxy()
                .tcp_nodelay(true)
                .pool_max_idle_per_host(usize::MAX)
                .pool_idle_timeout(Duration::from_secs(300))
                .timeout(Duration::from_millis(load.timeout_ms));
            if load.http2 {
                builder.http2_prior_knowledge().build()
            } else {
                builder.build()
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let approvals: Vec<String> = match &load.approve {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect(),
        None => Vec::new(),
    };
    if load.approve.is_some() && load.requests != Some(approvals.len() as u64) {
        return Err(format!(
            "load --approve: --requests must be the file's {} approvals",
            approvals.len()
        ));
    }
    let load = Arc::new(load);
    let approvals = Arc::new(approvals);
    let shared = Arc::new(Shared {
        next: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        max_in_flight: AtomicU64::new(0),
        retry_after_waits: AtomicU64::new(0),
        errors: std::sync::Mutex::new(Vec::new()),
        records: std::sync::Mutex::new(Vec::new()),
    });
    let start = Instant::now();
    let mut workers = Vec::with_capacity(load.concurrency);
    for worker in 0..load.concurrency {
        let delay = Duration::from_millis(load.ramp_ms * worker as u64 / load.concurrency as u64);
        workers.push(tokio::spawn(work(
            worker,
            start + delay,
            start,
            clients[worker % clients.len()].clone(),
            load.clone(),
            approvals.clone(),
            shared.clone(),
        )));
    }
    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await.map_err(|e| e.to_string())?);
    }
    let wall = start.elapsed();
    let cpu_after = procfs::cpu_time("self", ticks).map_err(|e| e.to_string())?;

    let (window_start, window_end) = match load.duration_ms {
        Some(d) => (load.window_start_ms * 1000, d * 1000),
        None => (0, wall.as_micros() as u64),
    };
    let mut statuses = BTreeMap::new();
    let mut answers = BTreeMap::new();
    let mut by_answer: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut all = Vec::with_capacity(samples.len());
    let mut in_window = Vec::new();
    let mut window_ok = 0;
    for s in &samples {
        let answer = s.answer();
        *answers.entry(answer.clone()).or_insert(0) += 1;
        let key = if s.status == 0 {
            "error".to_owned()
        } else {
            s.status.to_string()
        };
        *statuses.entry(key).or_insert(0) += 1;
        let latency = s.end_us - s.start_us;
        all.push(latency);
        if s.end_us >= window_start && s.end_us <= window_end {
            in_window.push(latency);
            by_answer.entry(answer).or_default().push(latency);
            if s.status == 200 {
                window_ok += 1;
            }
        }
    }
    if let Some(path) = &load.records {
        let records = shared.records.lock().unwrap();
        std::fs::write(path, records.concat()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let errors = shared.errors.lock().unwrap().clone();
    Ok(LoadReport {
        sent: samples.len() as u64,
        ok: statuses.get("200").copied().unwrap_or(0),
        statuses,
        answers,
        window_latency_by_answer: by_answer
            .into_iter()
            .map(|(k, v)| (k, Percentiles::of(v)))
            .collect(),
        retry_after_waits: shared.retry_after_waits.load(Ordering::Relaxed),
        errors,
        wall_ms: wall.as_secs_f64() * 1000.0,
        window_ms: window_end.saturating_sub(window_start) as f64 / 1000.0,
        window_ok,
        window_latency: Percentiles::of(in_window),
        latency: Percentiles::of(all),
        max_in_flight: shared.max_in_flight.load(Ordering::Relaxed),
        cpu_ms: (cpu_after - cpu_before).as_secs_f64() * 1000.0,
        stream: load.stream.then(|| stream_report(&samples)),
    })
}

struct Shared {
    next: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    retry_after_waits: AtomicU64,
    errors: std::sync::Mutex<Vec<String>>,
    records: std::sync::Mutex<Vec<String>>,
}

impl Shared {
    fn error(&self, message: String) {
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 8 && !errors.contains(&message) {
            errors.push(message);
        }
    }
}

async fn work(
    worker: usize,
    begin: Instant,
    start: Instant,
    client: reqwest::Client,
    load: Arc<LoadArgs>,
    approvals: Arc<Vec<String>>,
    shared: Arc<Shared>,
) -> Vec<Sample> {
    tokio::time::sleep_until(begin.into()).await;
    let deadline = load.duration_ms.map(|d| start + Duration::from_millis(d));
    let mut samples = Vec::new();
    let mut n = 0u64;
    loop {
        let order = match (deadline, load.requests) {
            (Some(deadline), _) => {
                if Instant::now() >= deadline {
                    break;
                }
                n += 1;
                format!("{}-{worker}-{n}", load.prefix)
            }
            (None, Some(total)) => {
                let n = shared.next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    break;
                }
                match approvals.get(n as usize) {
                    Some(id) => id.clone(),
                    None => format!("{}-{n}", load.prefix),
                }
            }
            (None, None) => break,
        };
        let url = match load.approve {
            Some(_) => format!("{}/approvals/{order}/approve", load.url),
            None => format!(
                "{}/checkout?orderId={order}&amount={}",
                load.url, load.amount
            ),
        };
        let in_flight = shared.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        shared.max_in_flight.fetch_max(in_flight, Ordering::Relaxed);
        let sent = Instant::now();
        let mut request = client.post(&url);
        if load.keyed {
            request = request.header("idempotency-key", order.as_str());
        }
        if load.stream {
            request = request.header(reqwest::header::ACCEPT, "text/event-stream");
        }
        let mut streamed = None;
        let answer = match request.send().await {
            Ok(response) if load.stream && is_event_stream(&response) => {
                let status = response.status().as_u16();
                match read_stream(response, start).await {
                    Ok((stream, body)) => {
                        streamed = Some(stream);
                        Ok((status, None, body.into()))
                    }
                    Err(err) => Err(err),
                }
            }
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .filter(|_| matches!(status, 429 | 503));
                match response.bytes().await {
                    Ok(body) => Ok((status, retry_after, body)),
                    Err(err) => Err(format!("reading the answer: {err}")),
                }
            }
            Err(err) => Err(format!("{err} ({:?})", std::error::Error::source(&err))),
        };
        let ended = Instant::now();
        shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        let mut wait = None;
        let mut code = None;
        let status = match answer {
            Ok((status, retry_after, body)) => {
                if status != 200 {
                    // A problem's `code`; a paused checkout's 202, its `status`
                    // (`requires_approval`).
                    code = serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| {
                            let field = if status == 202 { "status" } else { "code" };
                            v.get(field)?.as_str().map(str::to_owned)
                        });
                    if load.honor_retry_after {
                        wait = retry_after.map(Duration::from_secs);
                    }
                }
                if status != 200 && status != 202 && code.as_deref() != Some("overloaded") {
                    let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
                    shared.error(format!("{status}: {text}"));
                }
                if load.records.is_some() {
                    shared.records.lock().unwrap().push(match load.approve {
                        Some(_) => approval_record(&order, status, &body),
                        None => record(&order, status, &body),
                    });
                }
                status
            }
            Err(message) => {
                shared.error(message);
                if load.records.is_some() {
                    shared
                        .records
                        .lock()
                        .unwrap()
                        .push(format!("{order}\t0\t-\t-\n"));
                }
                0
            }
        };
        samples.push(Sample {
            start_us: (sent - start).as_micros() as u64,
            end_us: (ended - start).as_micros() as u64,
            stream: streamed,
            status,
            code,
        });
        if let Some(wait) = wait {
            shared.retry_after_waits.fetch_add(1, Ordering::Relaxed);
            let until = Instant::now() + wait;
            let until = deadline.map_or(until, |d| until.min(d));
            tokio::time::sleep_until(until.into()).await;
        }
    }
    samples
}

fn record(order: &str, status: u16, body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let receipt = parsed
        .as_ref()
        .and_then(|v| v.pointer("/receipt/id"))
        .and_then(|v| v.as_str())
        .unwrap_or("-");
    let attempts = parsed
        .as_ref()
        .and_then(|v| v.get("attempts"))
        .and_then(|v| v.as_u64())
        .map(|n| n.to_string())
        .unwrap_or_else(|| "-".into());
    let tokens = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.pointer(&format!("/usage/{name}")))
            .and_then(|v| v.as_u64())
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into())
    };
    let approval = parsed
        .as_ref()
        .and_then(|v| v.pointer("/approval/id"))
        .and_then(|v| v.as_str())
        .unwrap_or("-");
    format!(
        "{order}\t{status}\t{receipt}\t{attempts}\t{}\t{}\t{approval}\n",
        tokens("inputTokens"),
        tokens("outputTokens")
    )
}

/// An approval's answer: `approvalId<TAB>status<TAB>orderId<TAB>receiptId<TAB>charged`.
fn approval_record(approval: &str, status: u16, body: &[u8]) -> String {
    let parsed: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |pointer: &str| {
        parsed
            .pointer(pointer)
            .map(|v| match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .unwrap_or_else(|| "-".into())
    };
    format!(
        "{approval}\t{status}\t{}\t{}\t{}\n",
        text("/orderId"),
        text("/receipt/id"),
        text("/charged")
    )
}
