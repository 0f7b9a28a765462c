//! The orchestrator: starts the service, the scripted model and the load generator as
//! separate processes, runs the four figures on each database, prints the table and
//! writes `results.json`, `results.md` and `latency.svg`.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Connection;

use checkout::db::{Database, PoolSettings};
use checkout::model::WireApi;

use crate::args::Args;
use crate::child::{self, Env, Running};
use crate::floor::FloorReport;
use crate::load::{LoadArgs, LoadReport};
use crate::procfs;
use crate::report::{Metric, Target, table};
use crate::svg;

mod counts;
mod cpu;
mod keyed;
mod loops;
mod outage;
mod overload;
mod partial;
mod paused;
mod retry;
mod saving;
mod startup;
mod streams;
mod sweep;

/// The Postgres database the benchmark makes afresh, unless `--pg-db` names another.
pub(crate) const DB_NAME: &str = "checkout_bench";

/// How much of everything to do.
#[derive(Clone, Debug, Serialize)]
struct Plan {
    quick: bool,
    cpu_runs: usize,
    cpu_concurrency: usize,
    cpu_warmup_ms: u64,
    cpu_duration_ms: u64,
    loops_runs: usize,
    loops_concurrency: usize,
    model_delay_ms: u64,
    loops_ramp_ms: u64,
    loops_window_ms: u64,
    /// Figure 2 over HTTP/2: the load generator to the service (100 streams a
    /// connection, as a load balancer's pool), and the service to the model (h2c, one
    /// connection, as to an https provider, which ALPN puts on HTTP/2). `--http1` puts
    /// both on HTTP/1.1: a connection per checkout on each side, 2 descriptors a
    /// checkout in flight, which 10,000 in flight cannot have under a 20,000 limit.
    loops_http2: bool,
    retry_runs: usize,
    retry_requests: u64,
    retry_concurrency: usize,
    startup_runs: usize,
    sweep_instant: Vec<usize>,
    sweep_instant_ms: u64,
    sweep_slow: Vec<usize>,
    sweep_slow_window_ms: u64,
    /// Figure 8: the service's `CHECKOUT_MAX_IN_FLIGHT`; twice as many checkouts are
    /// offered at once.
    overload_limit: usize,
    overload_runs: usize,
    overload_window_ms: u64,
    /// Figure 9: runs, closed-loop checkouts, the model's delay, and the primary's
    /// phases: up, down, up again.
    outage_runs: usize,
    outage_concurrency: usize,
    outage_model_delay_ms: u64,
    outage_before_ms: u64,
    outage_window_ms: u64,
    outage_after_ms: u64,
    /// Figure 13: runs, the concurrencies, and each point's warm-up and window.
    keyed_runs: usize,
    keyed_in_flight: Vec<usize>,
    keyed_warmup_ms: u64,
    keyed_window_ms: u64,
    /// Figure 11: runs (each 10,000 checkouts paused, then approved).
    paused_runs: usize,
    /// Figure 12: runs (each 10,000 streamed checkouts at once).
    streams_runs: usize,
    /// Extra environment for every service process (`--service-env NAME=VALUE`).
    service_env: Vec<(String, String)>,
    /// Figure 7 with a webhook endpoint configured (`--webhooks`): every event type on,
    /// sent to a consumer here that answers 204 (then 410), beside the counts without one
    /// and the floor of one delivery.
    webhooks: bool,
    /// The model API the service and the floors speak (`--wire`): with `responses`, the
    /// service gets `OPENAI_WIRE_API=responses` and the floors send the Responses bodies.
    #[serde(serialize_with = "wire_name")]
    wire: WireApi,
}

fn wire_name<S: serde::Serializer>(wire: &WireApi, to: S) -> Result<S::Ok, S::Error> {
    to.serialize_str(wire.as_str())
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                cpu_runs: 3,
                cpu_concurrency: 64,
                cpu_warmup_ms: 150,
                cpu_duration_ms: 500,
                loops_runs: 1,
                loops_concurrency: 10_000,
                model_delay_ms: 2000,
                loops_ramp_ms: 4000,
                loops_window_ms: 2000,
                loops_http2: true,
                retry_runs: 2,
                retry_requests: 200,
                retry_concurrency: 64,
                startup_runs: 3,
                sweep_instant: vec![1, 16, 64],
                sweep_instant_ms: 300,
                sweep_slow: vec![],
                sweep_slow_window_ms: 0,
                overload_limit: 1_000,
                overload_runs: 1,
                overload_window_ms: 4000,
                outage_runs: 1,
                outage_concurrency: 8,
                outage_model_delay_ms: 50,
                outage_before_ms: 2000,
                outage_window_ms: 4000,
                outage_after_ms: 4000,
                keyed_runs: 1,
                keyed_in_flight: vec![1, 16, 32, 48, 64, 128, 256],
                keyed_warmup_ms: 300,
                keyed_window_ms: 1000,
                paused_runs: 1,
                streams_runs: 1,
                service_env: vec![],
                webhooks: false,
                wire: WireApi::Chat,
            }
        } else {
            Plan {
                quick,
                cpu_runs: 5,
                cpu_concurrency: 64,
                cpu_warmup_ms: 500,
                cpu_duration_ms: 2000,
                loops_runs: 3,
                loops_concurrency: 10_000,
                model_delay_ms: 2000,
                loops_ramp_ms: 4000,
                loops_window_ms: 8000,
                loops_http2: true,
                retry_runs: 3,
                retry_requests: 2000,
                retry_concurrency: 64,
                startup_runs: 11,
                sweep_instant: vec![1, 4, 16, 64, 256],
                sweep_instant_ms: 1500,
                sweep_slow: vec![1, 10, 100, 1000],
                sweep_slow_window_ms: 4000,
                overload_limit: 5_000,
                overload_runs: 3,
                overload_window_ms: 8000,
                outage_runs: 3,
                outage_concurrency: 8,
                outage_model_delay_ms: 50,
                outage_before_ms: 3000,
                outage_window_ms: 6000,
                outage_after_ms: 5000,
                keyed_runs: 3,
                keyed_in_flight: vec![1, 16, 32, 48, 64, 128, 256],
                keyed_warmup_ms: 500,
                keyed_window_ms: 2000,
                paused_runs: 3,
                streams_runs: 3,
                service_env: vec![],
                webhooks: false,
                wire: WireApi::Chat,
            }
        }
    }

    /// The model time of one checkout: two rounds.
    fn model_time_ms(&self) -> f64 {
        2.0 * self.model_delay_ms as f64
    }

    /// When throughput and latency start to count: the workers start evenly over a ramp
    /// as long as one checkout, so once the ramp is over and the first checkouts are
    /// done, checkouts end at an even rate.
    fn loops_window_start(&self, model_ms: f64) -> u64 {
        self.loops_ramp_ms.max(model_ms as u64) + 500
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Db {
    name: &'static str,
    pub(crate) service_url: String,
    floor_url: String,
    /// The SQLite file the service uses (to count its connections).
    sqlite_path: Option<PathBuf>,
    /// Postgres: a connection for the benchmark's own queries (not to the bench database).
    admin_url: Option<String>,
    /// Postgres: the bench database's name.
    pg_name: String,
}

struct Bench {
    env: Env,
    plan: Plan,
    rt: tokio::runtime::Runtime,
    ticks: u64,
    metrics: Vec<Metric>,
    details: BTreeMap<String, Value>,
    started: Instant,
    /// Plot points: (panel, series label, concurrency, ms).
    points: Vec<(u8, String, f64, f64)>,
    /// Figure 13's plot points: (panel, series label, concurrency, value).
    keyed_points: Vec<(u8, String, f64, f64)>,
}

const USAGE: &str = "\
usage: checkout-bench [--quick] [--only cpu,loops,retry,saving,startup,sweep,counts,overload,outage,partial,keyed,paused,streams]
                      [--db sqlite,postgres] [--runs N] [--concurrency N] [--overload-limit N]
                      [--http1] [--out DIR] [--work DIR]
                      [--service-bin PATH] [--no-build] [--postgres postgres://postgres@127.0.0.1:5432]
                      [--pg-db NAME]
                      [--service-env NAME=VALUE]... [--webhooks] [--wire chat|responses]
       checkout-bench load --url URL (--duration-ms N | --requests N) [--concurrency N] ...
       checkout-bench floor-axum | floor-reqwest --model URL [--wire W] | floor-sql --database URL
       checkout-bench floor-loop --model URL [--h2c] [--port P] [--wire W]
       checkout-bench floor-webhook --url URL [--requests N]

Starts the service (--service-bin, else the `checkout` binary beside this one; built
first when run through cargo), the scripted model and the load generator as separate processes on loopback, and
measures: 1 CPU per checkout against its floor, 2 loops in flight (10,000 concurrent
checkouts, a 2 s model; --http1 for HTTP/1.1) and the bytes per waiting loop against
its floor (floor-loop), 3 retry amplification (20 % of model requests 503), 4 start-up,
7 instructions and heap allocations per checkout (under valgrind: callgrind, dhat;
--webhooks: each without a webhook endpoint, then with one configured, every event type
on, a consumer here answering 204, each window's events delivered before it is counted,
then instructions with the consumer answering 410 (the endpoint gone: events written,
none sent), and the floor of one signed POST by a bare reqwest client, floor-webhook),
8 overload (twice --overload-limit checkouts offered at once: 1,000 with --quick, else
5,000; the admitted ones served, the rest refused with 503 overloaded at once).
K keyed checkouts in flight (a fresh Idempotency-Key each, 1 to 256 in flight, an
instant model; DIR/keyed-in-flight.svg).
11 paused checkouts (--only paused, not in the default run: 10,000 checkouts paused for
approval, the service's RSS against its idle RSS, then all approved: drain time, receipts).
12 streamed checkouts (--only streams, not in the default run: 10,000 checkouts at once with
Accept: text/event-stream over HTTP/2, a 2 s model: bytes per waiting stream, time to the
first event, events/s, every stream RUN_FINISHED, one receipt each, CPU and database load).
--wire responses: the service on the Responses API (OPENAI_WIRE_API=responses), the
floors sending its bodies to /responses; chat by default.
--quick takes under a minute; the full run under ten. Writes DIR/results.json,
DIR/results.md and DIR/latency.svg (DIR/*-quick.* with --quick); DIR is --out, else
bench/ when run by `cargo run -p checkout-bench`, else the current directory. Logs and
SQLite files go to --work (default: checkout-bench in the temporary directory).";

pub fn main(args: &mut Args) -> Result<(), String> {
    if args.flag("--help") || args.flag("-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let command_line: Vec<String> = std::env::args().collect();
    let quick = args.flag("--quick");
    let mut plan = Plan::new(quick);
    let only: Vec<String> = args
        .value("--only")?
        .unwrap_or_else(|| {
            "startup,cpu,retry,saving,loops,sweep,counts,overload,outage,keyed".into()
        })
        .split(',')
        .map(str::to_owned)
        .collect();
    let db_names = args
        .value("--db")?
        .unwrap_or_else(|| "sqlite,postgres".into());
    if let Some(runs) = args.number::<usize>("--runs")? {
        plan.cpu_runs = runs;
        plan.loops_runs = runs;
        plan.retry_runs = runs;
        plan.startup_runs = runs;
        plan.overload_runs = runs;
        plan.outage_runs = runs;
        plan.keyed_runs = runs;
        plan.paused_runs = runs;
        plan.streams_runs = runs;
    }
    if let Some(c) = args.number::<usize>("--concurrency")? {
        plan.loops_concurrency = c;
    }
    if let Some(n) = args.number::<usize>("--overload-limit")? {
        plan.overload_limit = n.max(1);
    }
    plan.loops_http2 = !args.flag("--http1");
    plan.webhooks = args.flag("--webhooks");
    for pair in args.values("--service-env")? {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("--service-env {pair:?}: expected NAME=VALUE"))?;
        plan.service_env.push((name.to_owned(), value.to_owned()));
    }
    plan.wire = crate::floor::wire(args)?;
    if plan.wire == WireApi::Responses {
        plan.service_env
            .push(("OPENAI_WIRE_API".into(), plan.wire.as_str().into()));
    }
    let places = Places::parse(args)?;
    let pg_base = args
        .value("--postgres")?
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432".into());
    let pg_db = args.value("--pg-db")?.unwrap_or_else(|| DB_NAME.into());
    if pg_db.is_empty()
        || !pg_db
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(format!(
            "--pg-db {pg_db:?}: lower-case letters, digits and _ only"
        ));
    }
    args.done()?;

    let env = environment(places)?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let mut dbs = Vec::new();
    for name in db_names.split(',') {
        dbs.push(match name {
            "sqlite" => sqlite_db(&env, &rt)?,
            "postgres" => postgres_db(&rt, &pg_base, &pg_db)?,
            other => return Err(format!("--db: unknown database {other:?}")),
        });
    }
    let mut bench = Bench {
        ticks: procfs::clock_ticks(),
        env,
        plan,
        rt,
        metrics: Vec::new(),
        details: BTreeMap::new(),
        started: Instant::now(),
        points: Vec::new(),
        keyed_points: Vec::new(),
    };
    bench.note(&format!(
        "machine: {}; open files limit here {:?}; model wire: {}",
        procfs::machine(),
        procfs::open_files_limit("self"),
        bench.plan.wire.as_str()
    ));
    for figure in [
        "startup", "cpu", "retry", "saving", "loops", "sweep", "counts", "overload", "outage",
        "partial", "keyed", "paused", "streams",
    ] {
        if !only.iter().any(|o| o == figure) {
            continue;
        }
        for db in &dbs {
            let result = match figure {
                "startup" => bench.startup(db),
                "cpu" => bench.cpu(db),
                "retry" => bench.retry(db),
                "saving" => bench.saving(db),
                "loops" => bench.loops(db),
                "counts" => bench.counts(db),
                "overload" => bench.overload(db),
                "outage" => bench.outage(db),
                "partial" => bench.partial(db),
                "keyed" => bench.keyed(db),
                "paused" => bench.paused(db),
                "streams" => bench.streams(db),
                _ => bench.sweep(db),
            };
            if let Err(err) = result {
                bench.note(&format!("{figure} on {}: FAILED: {err}", db.name));
                bench
                    .details
                    .insert(format!("{figure}/{}/error", db.name), json!(err));
            }
        }
    }
    bench.finish(&command_line)
}

/// Where the benchmark takes its binaries from and writes to: `--service-bin`,
/// `--no-build`, `--work`, `--out`.
pub(crate) struct Places {
    service_bin: Option<PathBuf>,
    no_build: bool,
    work: Option<PathBuf>,
    out: Option<PathBuf>,
}

impl Places {
    pub(crate) fn parse(args: &mut Args) -> Result<Places, String> {
        Ok(Places {
            service_bin: args.value("--service-bin")?.map(PathBuf::from),
            no_build: args.flag("--no-build"),
            work: args.value("--work")?.map(PathBuf::from),
            out: args.value("--out")?.map(PathBuf::from),
        })
    }
}

/// Finds (and, run through cargo, builds) the service binary; makes the work directory.
///
/// Nothing here is fixed at build time, so the binary runs from any directory and on
/// another machine: the service is `--service-bin` or the `checkout` beside this
/// executable; the output goes to `--out`, else to the package's directory when cargo
/// runs it (`bench/`, beside the committed results), else to the current directory.
pub(crate) fn environment(places: Places) -> Result<Env, String> {
    let bench_bin = std::env::current_exe().map_err(|e| e.to_string())?;
    let profile_dir = bench_bin
        .parent()
        .ok_or("this binary has no directory")?
        .to_path_buf();
    // Set by `cargo run` when it starts this binary, never read at build time.
    let package_dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let cargo = std::env::var_os("CARGO").filter(|_| !places.no_build);
    let service_bin = match (places.service_bin, cargo, &package_dir) {
        (Some(path), _, _) => path,
        (None, Some(cargo), Some(package_dir)) => {
            build_service(&cargo, package_dir, &profile_dir)?;
            profile_dir.join("checkout")
        }
        (None, _, _) => profile_dir.join("checkout"),
    };
    if !service_bin.exists() {
        return Err(format!(
            "{} does not exist; build it (cargo build --release --bin checkout) and put it \
             beside this binary, or pass --service-bin",
            service_bin.display()
        ));
    }
    let service_bin = service_bin.canonicalize().map_err(|e| e.to_string())?;
    let work = places
        .work
        .unwrap_or_else(|| std::env::temp_dir().join("checkout-bench"));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let work = work.canonicalize().map_err(|e| e.to_string())?;
    let here = std::env::current_dir().map_err(|e| e.to_string())?;
    Ok(Env {
        service_bin,
        bench_bin,
        work,
        out: places
            .out
            .or_else(|| package_dir.clone())
            .unwrap_or_else(|| here.clone()),
        source: package_dir.unwrap_or(here),
    })
}

/// `cargo build -p checkout --bin checkout`, in this binary's profile.
fn build_service(cargo: &OsStr, package_dir: &Path, profile_dir: &Path) -> Result<(), String> {
    let mut build = Command::new(cargo);
    build
        .current_dir(package_dir)
        .args(["build", "-p", "checkout", "--bin", "checkout"]);
    undo_cargo_run_env(&mut build);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    eprintln!("checkout-bench: building the service (cargo build -p checkout --bin checkout)");
    let status = build.status().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("building the service failed: {status}"));
    }
    Ok(())
}

/// Takes away what `cargo run` added to the environment, so that the nested build sees
/// the environment the outer one saw (else build scripts that watch it rebuild half the
/// dependency tree, in both builds, every time).
fn undo_cargo_run_env(build: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || matches!(
                name.as_ref(),
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "RUST_RECURSION_COUNT"
            )
        {
            build.env_remove(name.as_ref());
        }
    }
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        let kept: Vec<PathBuf> = std::env::split_paths(&paths)
            .filter(|p| {
                let text = p.to_string_lossy();
                !(text.contains("/target/")
                    || text.contains("/rustlib/")
                    || text.contains("/toolchains/"))
            })
            .collect();
        if kept.is_empty() {
            build.env_remove("LD_LIBRARY_PATH");
        } else if let Ok(joined) = std::env::join_paths(kept) {
            build.env("LD_LIBRARY_PATH", joined);
        }
    }
}

fn pool() -> PoolSettings {
    PoolSettings {
        max_connections: 2,
        acquire_timeout: Duration::from_secs(10),
    }
}

/// Fresh SQLite files for the service and for the floor, migrated.
fn sqlite_db(env: &Env, rt: &tokio::runtime::Runtime) -> Result<Db, String> {
    let service = env.work.join("service.db");
    let floor = env.work.join("floor.db");
    let mut urls = Vec::new();
    for path in [&service, &floor] {
        child::remove_sqlite(path);
        let url = format!("sqlite://{}", path.display());
        rt.block_on(async {
            let db = Database::open(&url, &pool())
                .await
                .map_err(|e| e.to_string())?;
            db.close().await;
            Ok::<(), String>(())
        })?;
        urls.push(url);
    }
    Ok(Db {
        name: "sqlite",
        service_url: urls[0].clone(),
        floor_url: urls[1].clone(),
        sqlite_path: Some(service),
        admin_url: None,
        pg_name: String::new(),
    })
}

/// A fresh `checkout_bench` database on the machine's Postgres, migrated.
pub(crate) fn postgres_db(
    rt: &tokio::runtime::Runtime,
    base: &str,
    name: &str,
) -> Result<Db, String> {
    // `postgres://HOST:PORT[?OPTIONS]`: the options (e.g. sslmode=disable) go on every URL.
    let (base, options) = match base.split_once('?') {
        Some((base, options)) => (base, format!("?{options}")),
        None => (base, String::new()),
    };
    let base = base.trim_end_matches('/');
    let admin = format!("{base}/postgres{options}");
    let url = format!("{base}/{name}{options}");
    rt.block_on(async {
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .map_err(|e| format!("cannot reach Postgres at {admin}: {e}"))?;
        // `name` is checked: lower-case letters, digits and _.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        conn.close().await.map_err(|e| e.to_string())?;
        let db = Database::open(&url, &pool())
            .await
            .map_err(|e| e.to_string())?;
        db.close().await;
        Ok::<(), String>(())
    })?;
    Ok(Db {
        name: "postgres",
        service_url: url.clone(),
        floor_url: url,
        sqlite_path: None,
        admin_url: Some(admin),
        pg_name: name.to_owned(),
    })
}

/// `GET path` on `addr` over a fresh connection: the status and the body.
fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {text:?}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// `http://ADDR/...` → `ADDR`.
fn addr_of(url: &str) -> String {
    url.trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Chat-completions requests the scripted model has received.
fn model_requests(model: &Running) -> Result<u64, String> {
    let (status, body) =
        http_get(&addr_of(&model.url), "/_scripted/stats").map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("/_scripted/stats answered {status}"));
    }
    let stats: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    stats["requests"]
        .as_u64()
        .ok_or_else(|| format!("no requests in {body}"))
}

/// The value of an unlabelled gauge in the service's `/metrics`.
fn gauge(service: &Running, name: &str) -> Result<f64, String> {
    let (status, body) = http_get(&addr_of(&service.url), "/metrics").map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("/metrics answered {status}"));
    }
    metric_value(&body, name).ok_or_else(|| format!("no {name} in /metrics"))
}

/// The value of the series `name` (with its labels, if any) in a Prometheus scrape.
fn metric_value(scrape: &str, name: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The bound on loops the service sized at start-up (`checkout_loops_in_flight_limit`):
/// `CHECKOUT_MAX_IN_FLIGHT`, or less when the descriptor limit carries fewer loops.
fn loops_limit(service: &Running) -> Result<u64, String> {
    gauge(service, "checkout_loops_in_flight_limit").map(|v| v as u64)
}

/// What the sampler saw of the service while it ran.
#[derive(Clone, Debug, Default, Serialize)]
struct Peak {
    rss_bytes: u64,
    fds: u32,
    db_connections: u32,
}

struct Sampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Peak>,
}

impl Sampler {
    /// Every 100 ms: the service's RSS, its descriptors, and the database connections it
    /// holds (Postgres: backends on the bench database; SQLite: descriptors on the file).
    fn start(pid: u32, db: &Db) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let db = db.clone();
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let mut pg = db
                .admin_url
                .as_ref()
                .and_then(|url| rt.block_on(sqlx::PgConnection::connect(url)).ok());
            let mut peak = Peak::default();
            while !flag.load(Ordering::Relaxed) {
                if let Some(rss) = procfs::status_kb(pid, "VmRSS") {
                    peak.rss_bytes = peak.rss_bytes.max(rss);
                }
                let (fds, on_db) = procfs::descriptors(pid, db.sqlite_path.as_deref());
                peak.fds = peak.fds.max(fds);
                let conns = match pg.as_mut() {
                    Some(conn) => rt
                        .block_on(
                            sqlx::query_scalar::<_, i64>(
                                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'",
                            )
                            .bind(&db.pg_name)
                            .fetch_one(&mut *conn),
                        )
                        .unwrap_or(0) as u32,
                    None => on_db,
                };
                peak.db_connections = peak.db_connections.max(conns);
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        Sampler { stop, handle }
    }

    fn finish(self) -> Peak {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Bench {
    fn note(&self, text: &str) {
        eprintln!("[{:>6.1}s] {text}", self.started.elapsed().as_secs_f64());
    }

    fn cpu_of(&self, process: &Running) -> Result<Duration, String> {
        procfs::cpu_time(&process.pid_str(), self.ticks).map_err(|e| e.to_string())
    }

    /// Warm-up, then the measured load; the CPU `target` spent during the latter.
    /// `keyed`: every checkout with an `Idempotency-Key` of its own.
    fn measured_load(
        &self,
        target: &Running,
        prefix: &str,
        keyed: bool,
    ) -> Result<(LoadReport, Duration), String> {
        let plan = &self.plan;
        let mut warm = LoadArgs::new(&target.url, plan.cpu_concurrency, &format!("{prefix}w"));
        warm.duration_ms = Some(plan.cpu_warmup_ms);
        warm.keyed = keyed;
        child::load(&self.env, "load-warmup", &warm)?;
        let mut load = LoadArgs::new(&target.url, plan.cpu_concurrency, prefix);
        load.duration_ms = Some(plan.cpu_duration_ms);
        load.keyed = keyed;
        let before = self.cpu_of(target)?;
        let report = child::load(&self.env, "load", &load)?;
        let after = self.cpu_of(target)?;
        if report.ok != report.sent {
            return Err(format!(
                "{} of {} requests to {} failed: {:?} {:?}",
                report.sent - report.ok,
                report.sent,
                target.name,
                report.statuses,
                report.errors
            ));
        }
        Ok((report, after - before))
    }

    fn plot(&self) -> String {
        let mut panels = vec![
            svg::Panel {
                title: "instant model: latency".into(),
                y_label: "latency, ms".into(),
                series: vec![],
                limit: None,
            },
            svg::Panel {
                title: format!(
                    "{} ms model: latency above 2 rounds",
                    self.plan.model_delay_ms
                ),
                y_label: "latency above model time, ms".into(),
                series: vec![],
                limit: Some((200.0, "p99 target 200 ms".into())),
            },
        ];
        let mut points = self.points.clone();
        // The loops figure's medians are the 10,000-concurrent point of the slow panel.
        for db in ["sqlite", "postgres"] {
            for (q, name) in [
                ("p50", "p50 latency above model time"),
                ("p99", "p99 latency above model time"),
            ] {
                if let Some(m) = self.metrics.iter().find(|m| m.db == db && m.name == name) {
                    points.push((
                        1,
                        format!("{db} {q}"),
                        self.plan.loops_concurrency as f64,
                        m.median,
                    ));
                }
            }
        }
        plot_points(&mut panels, points);
        let caption = format!(
            "checkout-bench{}: {} (service, scripted model, load generator on loopback)",
            if self.plan.quick { " --quick" } else { "" },
            procfs::machine()
        );
        svg::render(&panels, &caption)
    }

    fn finish(self, command_line: &[String]) -> Result<(), String> {
        let table_text = table(&self.metrics);
        println!("{table_text}");
        let git = |args: &[&str]| {
            Command::new("git")
                .current_dir(&self.env.source)
                .args(args)
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default()
        };
        // Empty outside a git checkout (a copied binary): said so, not left blank.
        let commit = Some(git(&["rev-parse", "--short", "HEAD"])).filter(|c| !c.is_empty());
        let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
        let machine = procfs::machine();
        let elapsed = self.started.elapsed().as_secs_f64();
        let args: String = command_line
            .iter()
            .skip(1)
            .map(|a| format!(" {a}"))
            .collect();
        let command = match std::env::var_os("CARGO") {
            Some(_) => format!("cargo run --release -p checkout-bench --{args}"),
            None => format!("{}{args}", command_line[0]),
        };
        let met: Vec<&Metric> = self.metrics.iter().filter(|m| m.met.is_some()).collect();
        let mut missed: Vec<String> = met
            .iter()
            .filter(|m| m.met == Some(false))
            .map(|m| format!("{} ({})", m.name, m.db))
            .collect();
        missed.extend(
            self.details
                .keys()
                .filter(|k| k.ends_with("/error"))
                .map(|k| format!("{} FAILED", k.trim_end_matches("/error"))),
        );
        let results = json!({
            "command": command,
            "machine": machine,
            "git": {"commit": commit, "dirty": dirty},
            "finished_at": chrono::Utc::now().to_rfc3339(),
            "elapsed_s": elapsed,
            "plan": self.plan,
            "metrics": self.metrics,
            "targets": {"judged": met.len(), "missed": missed},
            "details": self.details,
        });
        let out_dir = &self.env.out;
        std::fs::create_dir_all(out_dir).map_err(|e| e.to_string())?;
        let suffix = if self.plan.quick { "-quick" } else { "" };
        let write = |stem: &str, ext: &str, text: &str| {
            let path = out_dir.join(format!("{stem}{suffix}.{ext}"));
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok::<PathBuf, String>(path)
        };
        let json_path = write(
            "results",
            "json",
            &serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?,
        )?;
        let md = format!(
            "# checkout-bench{}\n\n`{command}` on {machine}, commit {}{}, {elapsed:.0} s.\n\n{table_text}\nTargets missed: {}\n",
            if self.plan.quick { " --quick" } else { "" },
            commit.as_deref().unwrap_or("unknown"),
            if dirty {
                " (with uncommitted changes)"
            } else {
                ""
            },
            if missed.is_empty() {
                "none".to_owned()
            } else {
                missed.join(", ")
            }
        );
        let md_path = write("results", "md", &md)?;
        let svg_path = write("latency", "svg", &self.plot())?;
        if !self.keyed_points.is_empty() {
            let path = write("keyed-in-flight", "svg", &self.keyed_plot())?;
            eprintln!("checkout-bench: wrote {}", path.display());
        }
        eprintln!(
            "checkout-bench: {elapsed:.0} s; wrote {}, {}, {}; targets missed: {}",
            json_path.display(),
            md_path.display(),
            svg_path.display(),
            if missed.is_empty() {
                "none".to_owned()
            } else {
                missed.join(", ")
            }
        );
        Ok(())
    }
}

/// Puts plot points (panel, series label, x, y) into their panels' series, a series per
/// label: SQLite's blue, Postgres's red, p99 dashed.
fn plot_points(panels: &mut [svg::Panel], points: Vec<(u8, String, f64, f64)>) {
    for (panel, label, x, y) in points {
        let series = &mut panels[panel as usize].series;
        let at = match series.iter().position(|s| s.label == label) {
            Some(at) => at,
            None => {
                series.push(svg::Series {
                    color: if label.starts_with("sqlite") {
                        "#1f77b4"
                    } else {
                        "#d62728"
                    },
                    dashed: label.ends_with("p99"),
                    label,
                    points: vec![],
                });
                series.len() - 1
            }
        };
        series[at].points.push((x, y));
    }
}
