//! The orchestrator: starts the service, the scripted model and the load generator as
//! separate processes, runs the four figures on each database, prints the table and
//! writes `results.json`, `results.md` and `latency.svg`.

use std::collections::{BTreeMap, HashMap};
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

use crate::args::Args;
use crate::child::{self, Env, Running};
use crate::floor::FloorReport;
use crate::load::{LoadArgs, LoadReport};
use crate::procfs;
use crate::report::{Metric, Target, table};
use crate::svg;

const DB_NAME: &str = "checkout_bench";

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
    /// Extra environment for every service process (`--service-env NAME=VALUE`).
    service_env: Vec<(String, String)>,
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
                service_env: vec![],
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
                service_env: vec![],
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
}

const USAGE: &str = "\
usage: checkout-bench [--quick] [--only cpu,loops,retry,startup,sweep] [--db sqlite,postgres]
                      [--runs N] [--concurrency N] [--http1] [--out DIR] [--service-bin PATH]
                      [--no-build] [--postgres postgres://postgres@127.0.0.1:5432]
                      [--service-env NAME=VALUE]...
       checkout-bench load --url URL (--duration-ms N | --requests N) [--concurrency N] ...
       checkout-bench floor-axum | floor-reqwest --model URL | floor-sql --database URL

Starts the service (the `checkout` binary beside this one; built first when run through
cargo), the scripted model and the load generator as separate processes on loopback, and
measures: 1 CPU per checkout against its floor, 2 loops in flight (10,000 concurrent
checkouts, a 2 s model), 3 retry amplification (20 % of model requests 503), 4 start-up.
--quick takes under a minute; the full run under ten. Writes DIR/results.json,
DIR/results.md and DIR/latency.svg (DIR/*-quick.* with --quick).";

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
        .unwrap_or_else(|| "startup,cpu,retry,loops,sweep".into())
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
    }
    if let Some(c) = args.number::<usize>("--concurrency")? {
        plan.loops_concurrency = c;
    }
    plan.loops_http2 = !args.flag("--http1");
    for pair in args.values("--service-env")? {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("--service-env {pair:?}: expected NAME=VALUE"))?;
        plan.service_env.push((name.to_owned(), value.to_owned()));
    }
    let out_dir = PathBuf::from(args.value("--out")?.unwrap_or_else(|| "bench".into()));
    let service_bin = args.value("--service-bin")?.map(PathBuf::from);
    let no_build = args.flag("--no-build");
    let pg_base = args
        .value("--postgres")?
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432".into());
    args.done()?;

    let env = environment(service_bin, no_build)?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let mut dbs = Vec::new();
    for name in db_names.split(',') {
        dbs.push(match name {
            "sqlite" => sqlite_db(&env, &rt)?,
            "postgres" => postgres_db(&rt, &pg_base)?,
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
    };
    bench.note(&format!(
        "machine: {}; open files limit here {:?}",
        procfs::machine(),
        procfs::open_files_limit("self")
    ));
    for figure in ["startup", "cpu", "retry", "loops", "sweep"] {
        if !only.iter().any(|o| o == figure) {
            continue;
        }
        for db in &dbs {
            let result = match figure {
                "startup" => bench.startup(db),
                "cpu" => bench.cpu(db),
                "retry" => bench.retry(db),
                "loops" => bench.loops(db),
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
    bench.finish(&out_dir, &command_line)
}

/// Finds (and, run through cargo, builds) the service binary; makes the work directory.
pub(crate) fn environment(service_bin: Option<PathBuf>, no_build: bool) -> Result<Env, String> {
    let bench_bin = std::env::current_exe().map_err(|e| e.to_string())?;
    let profile_dir = bench_bin
        .parent()
        .ok_or("this binary has no directory")?
        .to_path_buf();
    let repo = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let service_bin = match service_bin {
        Some(path) => path,
        None => {
            if let (Some(cargo), false) = (std::env::var_os("CARGO"), no_build) {
                let mut build = Command::new(cargo);
                build
                    .current_dir(&repo)
                    .args(["build", "--bin", "checkout"]);
                undo_cargo_run_env(&mut build);
                if profile_dir.file_name().is_some_and(|n| n == "release") {
                    build.arg("--release");
                }
                eprintln!("checkout-bench: building the service (cargo build --bin checkout)");
                let status = build.status().map_err(|e| e.to_string())?;
                if !status.success() {
                    return Err(format!("building the service failed: {status}"));
                }
            }
            profile_dir.join("checkout")
        }
    };
    if !service_bin.exists() {
        return Err(format!(
            "{} does not exist; build it (cargo build --release --bin checkout) or pass --service-bin",
            service_bin.display()
        ));
    }
    let work = profile_dir
        .parent()
        .unwrap_or(&profile_dir)
        .join("checkout-bench");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let work = work.canonicalize().map_err(|e| e.to_string())?;
    Ok(Env {
        service_bin,
        bench_bin,
        work,
        repo,
    })
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
    })
}

/// A fresh `checkout_bench` database on the machine's Postgres, migrated.
pub(crate) fn postgres_db(rt: &tokio::runtime::Runtime, base: &str) -> Result<Db, String> {
    // `postgres://HOST:PORT[?OPTIONS]`: the options (e.g. sslmode=disable) go on every URL.
    let (base, options) = match base.split_once('?') {
        Some((base, options)) => (base, format!("?{options}")),
        None => (base, String::new()),
    };
    let base = base.trim_end_matches('/');
    let admin = format!("{base}/postgres{options}");
    let url = format!("{base}/{DB_NAME}{options}");
    rt.block_on(async {
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .map_err(|e| format!("cannot reach Postgres at {admin}: {e}"))?;
        sqlx::query("DROP DATABASE IF EXISTS checkout_bench WITH (FORCE)")
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query("CREATE DATABASE checkout_bench")
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
                                "SELECT count(*) FROM pg_stat_activity WHERE datname = 'checkout_bench' AND backend_type = 'client backend'",
                            )
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
    fn measured_load(
        &self,
        target: &Running,
        prefix: &str,
    ) -> Result<(LoadReport, Duration), String> {
        let plan = &self.plan;
        let mut warm = LoadArgs::new(&target.url, plan.cpu_concurrency, &format!("{prefix}w"));
        warm.duration_ms = Some(plan.cpu_warmup_ms);
        child::load(&self.env, "load-warmup", &warm)?;
        let mut load = LoadArgs::new(&target.url, plan.cpu_concurrency, prefix);
        load.duration_ms = Some(plan.cpu_duration_ms);
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

    /// Figure 1: CPU per checkout against the floor, 64 concurrent, instant model.
    fn cpu(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let (mut service, mut axum, mut pair, mut sql, mut floor, mut ratio, mut rate) =
            (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        let mut runs = Vec::new();
        for run in 1..=plan.cpu_runs {
            let model = child::model(&self.env, "model-instant", 0, "")?;
            let svc = child::service(
                &self.env,
                &format!("service-cpu-{}", db.name),
                &db.service_url,
                &model.url,
                &self.plan.service_env,
            )?;
            let (svc_load, svc_cpu) = self.measured_load(&svc, &format!("c{run}"))?;
            svc.stop();
            let floor_axum = child::floor_axum(&self.env)?;
            let (axum_load, axum_cpu) = self.measured_load(&floor_axum, &format!("a{run}"))?;
            floor_axum.stop();
            let span = |extra: &[&str]| {
                let mut a: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
                a.extend([
                    "--concurrency".into(),
                    plan.cpu_concurrency.to_string(),
                    "--warmup-ms".into(),
                    plan.cpu_warmup_ms.to_string(),
                    "--duration-ms".into(),
                    plan.cpu_duration_ms.to_string(),
                ]);
                a
            };
            let reqwest: FloorReport = child::run_json(
                &self.env,
                "floor-reqwest",
                &span(&["floor-reqwest", "--model", &model.url]),
            )?;
            model.stop();
            let statement: FloorReport = child::run_json(
                &self.env,
                "floor-sql",
                &span(&[
                    "floor-sql",
                    "--database",
                    &db.floor_url,
                    "--prefix",
                    &format!("f{run}"),
                ]),
            )?;
            let s = ms(svc_cpu) * 1000.0 / svc_load.ok as f64;
            let a = ms(axum_cpu) * 1000.0 / axum_load.ok as f64;
            let p = reqwest.cpu_per_op_us();
            let q = statement.cpu_per_op_us();
            self.note(&format!(
                "cpu {} run {run}: service {s:.1} us/checkout ({} checkouts, {:.0}/s, p50 {:.2} ms, p99 {:.2} ms); floor: axum {a:.1} + 2 POSTs {p:.1} + sql {q:.1} = {:.1} us; ratio {:.2}",
                db.name,
                svc_load.ok,
                svc_load.ok as f64 / svc_load.wall_ms * 1000.0,
                svc_load.latency.p50,
                svc_load.latency.p99,
                a + p + q,
                s / (a + p + q)
            ));
            service.push(s);
            axum.push(a);
            pair.push(p);
            sql.push(q);
            floor.push(a + p + q);
            ratio.push(s / (a + p + q));
            rate.push(svc_load.ok as f64 / svc_load.wall_ms * 1000.0);
            runs.push(json!({
                "service": {"load": svc_load, "cpu_ms": ms(svc_cpu)},
                "axum": {"load": axum_load, "cpu_ms": ms(axum_cpu)},
                "reqwest_pairs": reqwest,
                "sql_statements": statement,
            }));
        }
        let d = db.name;
        self.metrics.extend([
            Metric::new(1, "CPU per checkout, service", d, "us", service),
            Metric::new(1, "floor: bare axum handler", d, "us", axum),
            Metric::new(1, "floor: 2 bare reqwest POSTs", d, "us", pair),
            Metric::new(1, "floor: bare sqlx charge", d, "us", sql),
            Metric::new(1, "floor, total", d, "us", floor),
            Metric::new(1, "ratio service / floor", d, "x", ratio).target(Target::AtMost(1.5)),
            Metric::new(1, "checkouts/s at 64 (instant model)", d, "1/s", rate),
        ]);
        self.details.insert(format!("cpu/{d}"), json!(runs));
        Ok(())
    }

    /// Figure 2: many loops in flight against a slow model.
    fn loops(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let c = plan.loops_concurrency;
        let model_ms = plan.model_time_ms();
        let mut m: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut runs = Vec::new();
        let mut service_env = plan.service_env.clone();
        if plan.loops_http2 {
            service_env.push(("CHECKOUT_MODEL_H2C".into(), "true".into()));
        }
        for run in 1..=plan.loops_runs {
            let model = child::model(&self.env, "model-slow", plan.model_delay_ms, "")?;
            let svc = child::service(
                &self.env,
                &format!("service-loops-{}", db.name),
                &db.service_url,
                &model.url,
                &service_env,
            )?;
            let idle_rss = procfs::status_kb(svc.pid(), "VmRSS").unwrap_or(0);
            let sampler = Sampler::start(svc.pid(), db);
            let mut load = LoadArgs::new(&svc.url, c, &format!("l{run}"));
            load.ramp_ms = plan.loops_ramp_ms;
            load.window_start_ms = plan.loops_window_start(model_ms);
            load.duration_ms = Some(load.window_start_ms + plan.loops_window_ms);
            load.http2 = plan.loops_http2;
            let requests_before = model_requests(&model)?;
            let report = child::load(&self.env, "load-loops", &load)?;
            let requests = model_requests(&model)? - requests_before;
            let hwm = procfs::status_kb(svc.pid(), "VmHWM").unwrap_or(0);
            let peak = sampler.finish();
            let log = std::fs::read_to_string(&svc.log).unwrap_or_default();
            svc.stop();
            model.stop();
            let success = 100.0 * report.ok as f64 / report.sent.max(1) as f64;
            let throughput = report.window_ok as f64 / (report.window_ms / 1000.0);
            let ideal = c as f64 / (model_ms / 1000.0);
            let p50 = report.window_latency.p50 - model_ms;
            let p99 = report.window_latency.p99 - model_ms;
            self.note(&format!(
                "loops {} run {run}: {c} concurrent (max in flight {}), {} sent, {success:.2} % ok {:?}, throughput {throughput:.0}/s of ideal {ideal:.0}/s, overhead p50 {p50:.0} ms p99 {p99:.0} ms, peak RSS {:.0} MiB, fds {}, db connections {}, model requests/checkout {:.3}; load generator CPU {:.0} ms",
                db.name,
                report.max_in_flight,
                report.sent,
                report.statuses,
                hwm as f64 / 1048576.0,
                peak.fds,
                peak.db_connections,
                requests as f64 / report.ok.max(1) as f64,
                report.cpu_ms,
            ));
            if !report.errors.is_empty() {
                self.note(&format!("  failures: {:?}", report.errors));
            }
            let warnings: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .take(5)
                .collect();
            if !warnings.is_empty() {
                self.note(&format!("  service warnings: {warnings:#?}"));
            }
            m.entry("success").or_default().push(success);
            m.entry("ratio").or_default().push(throughput / ideal);
            m.entry("p50").or_default().push(p50);
            m.entry("p99").or_default().push(p99);
            m.entry("rss").or_default().push(hwm as f64 / 1048576.0);
            m.entry("conns")
                .or_default()
                .push(peak.db_connections as f64);
            m.entry("fds").or_default().push(peak.fds as f64);
            m.entry("tput").or_default().push(throughput);
            runs.push(json!({
                "load": report,
                "peak": peak,
                "vm_hwm_bytes": hwm,
                "idle_rss_bytes": idle_rss,
                "model_requests": requests,
            }));
        }
        let d = db.name;
        let mut take = |k: &str| m.remove(k).unwrap_or_default();
        let protocol = if plan.loops_http2 {
            "HTTP/2"
        } else {
            "HTTP/1.1"
        };
        let name = |s: &str| {
            format!(
                "{s} ({c} concurrent, 2x{} ms model, {protocol})",
                plan.model_delay_ms
            )
        };
        self.metrics.extend([
            Metric::new(2, &name("success"), d, "%", take("success"))
                .target_every_run(Target::AtLeast(100.0)),
            Metric::new(2, "throughput", d, "1/s", take("tput")),
            Metric::new(2, "throughput / ideal", d, "x", take("ratio"))
                .target(Target::AtLeast(0.9)),
            Metric::new(2, "p50 latency above model time", d, "ms", take("p50")),
            Metric::new(2, "p99 latency above model time", d, "ms", take("p99"))
                .target(Target::AtMost(200.0)),
            Metric::new(2, "service peak RSS (VmHWM)", d, "MiB", take("rss"))
                .target(Target::AtMost(256.0)),
            Metric::new(2, "database connections used", d, "", take("conns")),
            Metric::new(2, "service open descriptors, peak", d, "", take("fds")),
        ]);
        self.details.insert(format!("loops/{d}"), json!(runs));
        Ok(())
    }

    /// Receipts of the orders `prefix-*`: order id → receipt ids.
    fn receipts(&self, db: &Db, prefix: &str) -> Result<HashMap<String, Vec<String>>, String> {
        let pattern = format!("{prefix}-%");
        let rows: Vec<(String, String)> = self.rt.block_on(async {
            if db.service_url.starts_with("postgres") {
                let mut conn = sqlx::PgConnection::connect(&db.service_url)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::query_as("SELECT order_id, id::text FROM receipts WHERE order_id LIKE $1")
                    .bind(&pattern)
                    .fetch_all(&mut conn)
                    .await
                    .map_err(|e| e.to_string())
            } else {
                let mut conn = sqlx::SqliteConnection::connect(&db.service_url)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::query_as("SELECT order_id, id FROM receipts WHERE order_id LIKE ?1")
                    .bind(&pattern)
                    .fetch_all(&mut conn)
                    .await
                    .map_err(|e| e.to_string())
            }
        })?;
        let mut by_order: HashMap<String, Vec<String>> = HashMap::new();
        for (order, id) in rows {
            by_order.entry(order).or_default().push(id);
        }
        Ok(by_order)
    }

    /// Figure 3: model requests per checkout with 20 % of them answered 503.
    fn retry(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let mut m: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut runs = Vec::new();
        for run in 1..=plan.retry_runs {
            let mut per = Vec::new();
            let mut run_detail = serde_json::Map::new();
            for (label, faults) in [("fault-free", ""), ("503%20", "503%20")] {
                let model = child::model(&self.env, &format!("model-{label}"), 0, faults)?;
                let svc = child::service(
                    &self.env,
                    &format!("service-retry-{}", db.name),
                    &db.service_url,
                    &model.url,
                    &self.plan.service_env,
                )?;
                let prefix = format!("r{}{run}", if faults.is_empty() { "c" } else { "f" });
                let records = self
                    .env
                    .work
                    .join(format!("records-{}-{prefix}.tsv", db.name));
                let mut load = LoadArgs::new(&svc.url, plan.retry_concurrency, &prefix);
                load.requests = Some(plan.retry_requests);
                load.records = Some(records.clone());
                let before = model_requests(&model)?;
                let report = child::load(&self.env, "load-retry", &load)?;
                let requests = model_requests(&model)? - before;
                svc.stop();
                model.stop();
                let per_checkout = requests as f64 / report.ok.max(1) as f64;
                per.push(per_checkout);
                // Every order answered 200 has exactly one receipt, the one it was shown.
                let receipts = self.receipts(db, &prefix)?;
                let text = std::fs::read_to_string(&records).map_err(|e| e.to_string())?;
                let (mut min_ok, mut max_any, mut mismatched, mut charged_failed) =
                    (u64::MAX, 0u64, 0u64, 0u64);
                let mut attempts: BTreeMap<String, u64> = BTreeMap::new();
                for line in text.lines() {
                    let f: Vec<&str> = line.split('\t').collect();
                    let (order, status, receipt) = (f[0], f[1], f[2]);
                    let found = receipts.get(order).map(Vec::as_slice).unwrap_or(&[]);
                    max_any = max_any.max(found.len() as u64);
                    if status == "200" {
                        min_ok = min_ok.min(found.len() as u64);
                        if found != [receipt.to_owned()] {
                            mismatched += 1;
                        }
                        *attempts.entry(f[3].to_owned()).or_default() += 1;
                    } else if !found.is_empty() {
                        charged_failed += 1;
                    }
                }
                let min_ok = if min_ok == u64::MAX { 0 } else { min_ok };
                let success = 100.0 * report.ok as f64 / report.sent.max(1) as f64;
                self.note(&format!(
                    "retry {} run {run} {label}: {} of {} ok ({success:.1} %), {requests} model requests = {per_checkout:.3} per checkout; receipts per 200 order min {min_ok} max (any order) {max_any}, mismatched {mismatched}, failed but charged {charged_failed}; loop attempts {attempts:?}; p50 {:.1} ms p99 {:.1} ms",
                    db.name,
                    report.ok,
                    report.sent,
                    report.latency.p50,
                    report.latency.p99
                ));
                if !report.errors.is_empty() {
                    self.note(&format!("  failures: {:?}", report.errors));
                }
                if !faults.is_empty() {
                    m.entry("success").or_default().push(success);
                    m.entry("min").or_default().push(min_ok as f64);
                    m.entry("max").or_default().push(max_any as f64);
                    m.entry("mismatched").or_default().push(mismatched as f64);
                    m.entry("charged_failed")
                        .or_default()
                        .push(charged_failed as f64);
                }
                run_detail.insert(
                    label.to_owned(),
                    json!({"load": report, "model_requests": requests, "per_checkout": per_checkout,
                        "receipts_per_ok_order_min": min_ok, "receipts_per_order_max": max_any,
                        "mismatched": mismatched, "failed_but_charged": charged_failed, "attempts": attempts}),
                );
            }
            m.entry("clean").or_default().push(per[0]);
            m.entry("faulty").or_default().push(per[1]);
            m.entry("amp").or_default().push(per[1] / per[0]);
            runs.push(Value::Object(run_detail));
        }
        let d = db.name;
        let mut take = |k: &str| m.remove(k).unwrap_or_default();
        self.metrics.extend([
            Metric::new(
                3,
                "model requests per checkout, fault-free",
                d,
                "",
                take("clean"),
            ),
            Metric::new(
                3,
                "model requests per checkout, 20% 503",
                d,
                "",
                take("faulty"),
            ),
            Metric::new(3, "retry amplification", d, "x", take("amp")).target(Target::AtMost(1.3)),
            Metric::new(3, "success with 20% 503", d, "%", take("success")),
            Metric::new(
                3,
                "receipts per order answered 200, min",
                d,
                "",
                take("min"),
            )
            .target_every_run(Target::Exactly(1.0)),
            Metric::new(3, "receipts per order, max", d, "", take("max"))
                .target_every_run(Target::Exactly(1.0)),
            Metric::new(
                3,
                "200s whose receipt differs from the table",
                d,
                "",
                take("mismatched"),
            )
            .target_every_run(Target::Exactly(0.0)),
            Metric::new(
                3,
                "orders answered an error but charged",
                d,
                "",
                take("charged_failed"),
            ),
        ]);
        self.details.insert(format!("retry/{d}"), json!(runs));
        Ok(())
    }

    /// One start: process start to the first 200 from /health/ready.
    fn start_once(&self, db: &Db, model_url: &str) -> Result<Duration, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = self
            .env
            .work
            .join(format!("service-startup-{}.log", db.name));
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut command = child::service_command(&self.env, &db.service_url, model_url);
        command.envs(self.plan.service_env.iter().map(|(k, v)| (k, v)));
        command
            .env("CHECKOUT_LISTEN", &addr)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| e.to_string())?)
            .stderr(file);
        let started = Instant::now();
        let mut process = command.spawn().map_err(|e| e.to_string())?;
        let result = loop {
            if let Ok((200, _)) = http_get(&addr, "/health/ready") {
                break Ok(started.elapsed());
            }
            if let Ok(Some(status)) = process.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                break Err(format!(
                    "the service exited with {status}:\n{}",
                    child::tail(&text)
                ));
            }
            if started.elapsed() > Duration::from_secs(20) {
                break Err("the service was not ready within 20 s".into());
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        let _ = process.kill();
        let _ = process.wait();
        result
    }

    /// Figure 4: start-up to ready, migrations already applied.
    fn startup(&mut self, db: &Db) -> Result<(), String> {
        let model = child::model(&self.env, "model-startup", 0, "")?;
        // One start first, not counted: the binary and the database files in the cache.
        self.start_once(db, &model.url)?;
        let mut times = Vec::new();
        for _ in 0..self.plan.startup_runs {
            times.push(ms(self.start_once(db, &model.url)?));
        }
        model.stop();
        self.note(&format!("start-up {}: {times:.1?} ms", db.name));
        let target = if db.name == "sqlite" { 100.0 } else { 300.0 };
        self.metrics.push(
            Metric::new(4, "start-up to /health/ready", db.name, "ms", times)
                .target(Target::AtMost(target)),
        );
        Ok(())
    }

    /// The plot's points: latency against concurrency, instant and slow model.
    fn sweep(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let model = child::model(&self.env, "model-sweep-instant", 0, "")?;
        let svc = child::service(
            &self.env,
            &format!("service-sweep-{}", db.name),
            &db.service_url,
            &model.url,
            &self.plan.service_env,
        )?;
        let mut detail = Vec::new();
        for &c in &plan.sweep_instant {
            let mut load = LoadArgs::new(&svc.url, c, &format!("si{c}"));
            load.duration_ms = Some(plan.sweep_instant_ms);
            let r = child::load(&self.env, "load-sweep", &load)?;
            self.note(&format!(
                "sweep {} instant model, {c} concurrent: p50 {:.2} ms p99 {:.2} ms, {:.0}/s, {} failed",
                db.name,
                r.latency.p50,
                r.latency.p99,
                r.ok as f64 / r.wall_ms * 1000.0,
                r.sent - r.ok
            ));
            let label = |q: &str| format!("{} {q}", db.name);
            self.points.push((0, label("p50"), c as f64, r.latency.p50));
            self.points.push((0, label("p99"), c as f64, r.latency.p99));
            detail.push(json!({"model_ms": 0, "concurrency": c, "load": r}));
        }
        svc.stop();
        model.stop();
        if !plan.sweep_slow.is_empty() {
            let model = child::model(&self.env, "model-sweep-slow", plan.model_delay_ms, "")?;
            let svc = child::service(
                &self.env,
                &format!("service-sweep-{}", db.name),
                &db.service_url,
                &model.url,
                &self.plan.service_env,
            )?;
            let model_ms = plan.model_time_ms();
            for &c in &plan.sweep_slow {
                let mut load = LoadArgs::new(&svc.url, c, &format!("ss{c}"));
                load.ramp_ms = plan.loops_ramp_ms;
                load.window_start_ms = plan.loops_window_start(model_ms);
                load.duration_ms = Some(load.window_start_ms + plan.sweep_slow_window_ms);
                let r = child::load(&self.env, "load-sweep", &load)?;
                let (p50, p99) = (
                    r.window_latency.p50 - model_ms,
                    r.window_latency.p99 - model_ms,
                );
                self.note(&format!(
                    "sweep {} 2x{} ms model, {c} concurrent: overhead p50 {p50:.1} ms p99 {p99:.1} ms ({} in window), {} failed",
                    db.name,
                    plan.model_delay_ms,
                    r.window_latency.n,
                    r.sent - r.ok
                ));
                self.points
                    .push((1, format!("{} p50", db.name), c as f64, p50));
                self.points
                    .push((1, format!("{} p99", db.name), c as f64, p99));
                detail.push(json!({"model_ms": model_ms, "concurrency": c, "load": r}));
            }
            svc.stop();
            model.stop();
        }
        self.details
            .insert(format!("sweep/{}", db.name), json!(detail));
        Ok(())
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
        for (panel, label, x, y) in points {
            let series = &mut panels[panel as usize].series;
            if !series.iter().any(|s| s.label == label) {
                series.push(svg::Series {
                    color: if label.starts_with("sqlite") {
                        "#1f77b4"
                    } else {
                        "#d62728"
                    },
                    dashed: label.ends_with("p99"),
                    label: label.clone(),
                    points: vec![],
                });
            }
            if let Some(s) = series.iter_mut().find(|s| s.label == label) {
                s.points.push((x, y));
            }
        }
        let caption = format!(
            "checkout-bench{}: {} (service, scripted model, load generator on loopback)",
            if self.plan.quick { " --quick" } else { "" },
            procfs::machine()
        );
        svg::render(&panels, &caption)
    }

    fn finish(self, out_dir: &Path, command_line: &[String]) -> Result<(), String> {
        let table_text = table(&self.metrics);
        println!("{table_text}");
        let git = |args: &[&str]| {
            Command::new("git")
                .current_dir(&self.env.repo)
                .args(args)
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default()
        };
        let commit = git(&["rev-parse", "--short", "HEAD"]);
        let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
        let machine = procfs::machine();
        let elapsed = self.started.elapsed().as_secs_f64();
        let command = format!(
            "cargo run --release --bin checkout-bench --{}",
            command_line
                .iter()
                .skip(1)
                .map(|a| format!(" {a}"))
                .collect::<String>()
        );
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
            "# checkout-bench{}\n\n`{command}` on {machine}, commit {commit}{}, {elapsed:.0} s.\n\n{table_text}\nTargets missed: {}\n",
            if self.plan.quick { " --quick" } else { "" },
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
