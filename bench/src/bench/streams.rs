//! Figure 12: streamed checkouts in flight (issue 33). 10,000 checkouts at once, each
//! asking for its events (`Accept: text/event-stream`) over HTTP/2, against the scripted
//! model answering after 2 s a round (two rounds): what one waiting stream costs in
//! memory against the loops' target (16 KB over HTTP/2), how soon a stream's first event
//! comes, how many events a second are delivered, that every stream ends with
//! `RUN_FINISHED` and every order has its one receipt, and what the service's CPU and
//! the database do while the streams wait.
//!
//! Per run, one service process (`CHECKOUT_MAX_IN_FLIGHT` at least the streams, the
//! model over h2c as in figure 2): a warm-up of [`WARMUP`] streamed checkouts at once, a
//! settle, the idle RSS (`VmRSS`); then the 10,000, one a worker, started evenly over
//! [`RAMP_MS`] (shorter than a model round, so that all are in flight at once); the peak
//! RSS (`VmHWM`); the service's CPU and, on Postgres, the database's transactions and its
//! backends' CPU from just before the load to its end. Then a fresh process under a fifth
//! of the streams, after the same warm-up: its peak RSS gives the slope, what one more
//! waiting stream costs (figure 2's method).

use super::*;

/// The figure's streams, one a worker.
const STREAMS: usize = 10_000;
/// Streamed checkouts at once before the idle RSS is read.
const WARMUP: usize = 200;
/// The workers start evenly over this: all are in flight before the first model answer.
const RAMP_MS: u64 = 1_500;
/// Over HTTP/2, the most one waiting loop may add to the service's peak RSS (figure 2's).
const BYTES_TARGET: f64 = 16_384.0;
/// How long the service is left alone before its idle RSS is read, and how long after
/// the load Postgres is given to publish its backends' counters (they flush within 1 s).
const SETTLE_MS: u64 = 1_500;
const MIB: f64 = 1024.0 * 1024.0;

/// What the database did over a span (Postgres only).
#[derive(Clone, Copy, Default)]
struct DbLoad {
    /// Transactions committed and rolled back on the bench database.
    transactions: i64,
    /// CPU time of the backends connected to it, by pid.
    backend_cpu: Duration,
}

/// Transactions on the bench database so far, and its backends' CPU time by pid.
type DbCounters = (i64, HashMap<i32, Duration>);

impl Bench {
    /// Transactions on the bench database so far, and its backends' CPU time.
    fn db_load(&self, db: &Db) -> Result<Option<DbCounters>, String> {
        let Some(admin) = &db.admin_url else {
            return Ok(None);
        };
        let (xacts, pids): (i64, Vec<i32>) = self.rt.block_on(async {
            let mut conn = sqlx::PgConnection::connect(admin)
                .await
                .map_err(|e| e.to_string())?;
            let xacts: i64 = sqlx::query_scalar(
                "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = $1",
            )
            .bind(&db.pg_name)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
            let pids: Vec<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'",
            )
            .bind(&db.pg_name)
            .fetch_all(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
            Ok::<_, String>((xacts, pids))
        })?;
        let cpu = pids
            .into_iter()
            .filter_map(|pid| Some((pid, procfs::cpu_time(&pid.to_string(), self.ticks).ok()?)))
            .collect();
        Ok(Some((xacts, cpu)))
    }

    /// A fresh service's peak RSS (`VmHWM`) under `n` streamed checkouts at once, after
    /// the same warm-up: the low point of the slope.
    fn streams_hwm(&self, db: &Db, env: &[(String, String)], n: usize) -> Result<u64, String> {
        let model = child::model(&self.env, "model-streams", self.plan.model_delay_ms, "")?;
        let svc = child::service(
            &self.env,
            &format!("service-streams-{}-{n}", db.name),
            &db.service_url,
            &model.url,
            env,
        )?;
        for (prefix, count, ramp_ms) in [("swl", WARMUP, 0), ("sl", n, RAMP_MS)] {
            let mut load = LoadArgs::new(&svc.url, count, prefix);
            load.requests = Some(count as u64);
            load.ramp_ms = ramp_ms;
            load.http2 = true;
            load.stream = true;
            let r = child::load(&self.env, "load-streams-low", &load)?;
            if r.stream.as_ref().map_or(0, |s| s.finished) != count as u64 {
                return Err(format!(
                    "{n} streams: not every stream finished: {:?} {:?}",
                    r.answers, r.stream
                ));
            }
        }
        let hwm = procfs::status_kb(svc.pid(), "VmHWM").unwrap_or(0);
        svc.stop();
        model.stop();
        Ok(hwm)
    }

    pub(super) fn streams(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let d = db.name;
        let model_ms = plan.model_time_ms();
        let mut m: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut details = Vec::new();
        let mut env = plan.service_env.clone();
        if !env.iter().any(|(k, _)| k == "CHECKOUT_MAX_IN_FLIGHT") {
            env.push((
                "CHECKOUT_MAX_IN_FLIGHT".into(),
                STREAMS.max(10_000).to_string(),
            ));
        }
        env.push(("CHECKOUT_MODEL_H2C".into(), "true".into()));
        for run in 1..=plan.streams_runs {
            let model = child::model(&self.env, "model-streams", plan.model_delay_ms, "")?;
            let svc = child::service(
                &self.env,
                &format!("service-streams-{d}"),
                &db.service_url,
                &model.url,
                &env,
            )?;
            let pid = svc.pid();
            let limit = loops_limit(&svc)?;
            if (limit as usize) < STREAMS {
                self.note(&format!(
                    "streams {d} run {run}: the service admits {limit} loops at once, fewer than the {STREAMS} streams"
                ));
            }
            let mut warm = LoadArgs::new(&svc.url, WARMUP, &format!("sw{run}"));
            warm.requests = Some(WARMUP as u64);
            warm.http2 = true;
            warm.stream = true;
            let warm = child::load(&self.env, "load-streams-warmup", &warm)?;
            if warm.stream.as_ref().map_or(0, |s| s.finished) != WARMUP as u64 {
                return Err(format!(
                    "warm-up: not every stream finished: {:?} {:?} {:?}",
                    warm.answers, warm.stream, warm.errors
                ));
            }
            std::thread::sleep(Duration::from_millis(SETTLE_MS));
            let idle = procfs::status_kb(pid, "VmRSS").unwrap_or(0);

            let prefix = format!("s{run}");
            let records = self.env.work.join(format!("records-streams-{d}-{run}.tsv"));
            let mut load = LoadArgs::new(&svc.url, STREAMS, &prefix);
            load.requests = Some(STREAMS as u64);
            load.ramp_ms = RAMP_MS;
            load.http2 = true;
            load.stream = true;
            load.records = Some(records.clone());
            let db_before = self.db_load(db)?;
            let cpu_before = self.cpu_of(&svc)?;
            let report = child::load(&self.env, "load-streams", &load)?;
            let cpu = self.cpu_of(&svc)? - cpu_before;
            let hwm = procfs::status_kb(pid, "VmHWM").unwrap_or(0);
            std::thread::sleep(Duration::from_millis(SETTLE_MS));
            let db_after = self.db_load(db)?;
            svc.stop();
            model.stop();
            let db_load = match (db_before, db_after) {
                (Some((x0, cpu0)), Some((x1, cpu1))) => Some(DbLoad {
                    transactions: x1 - x0,
                    backend_cpu: cpu1
                        .iter()
                        .map(|(pid, t)| {
                            t.saturating_sub(cpu0.get(pid).copied().unwrap_or_default())
                        })
                        .sum(),
                }),
                _ => None,
            };

            // The slope from a fifth of the streams, in a fresh process: what one more
            // waiting stream costs, what the process holds however many wait cancelled
            // out (figure 2's method for a waiting loop).
            let low_hwm = self.streams_hwm(db, &env, STREAMS / 5)?;
            let slope = (hwm as f64 - low_hwm as f64) / (STREAMS - STREAMS / 5) as f64;
            let streams = report.stream.clone().unwrap_or_default();
            let text = std::fs::read_to_string(&records).map_err(|e| e.to_string())?;
            let shown: HashMap<&str, &str> = text
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split('\t').collect();
                    (f.len() > 2 && f[1] == "200" && f[2] != "-").then(|| (f[0], f[2]))
                })
                .collect();
            let receipts = self.receipts(db, &prefix)?;
            let receipt_count: usize = receipts.values().map(Vec::len).sum();
            let mismatched = (0..STREAMS)
                .filter(|n| {
                    let order = format!("{prefix}-{n}");
                    match (shown.get(order.as_str()), receipts.get(&order)) {
                        (Some(shown), Some(ids)) => ids.as_slice() != [(*shown).to_owned()],
                        _ => true,
                    }
                })
                .count();
            let span_s = report.wall_ms / 1000.0;
            let per_stream = (hwm as f64 - idle as f64) / STREAMS as f64;
            let events_rate = streams.events as f64 / (streams.span_ms / 1000.0).max(1e-9);
            self.note(&format!(
                "streams {d} run {run}: {} sent, answers {:?}, max in flight {}; {} streams ended RUN_FINISHED success, otherwise {:?}; {} events ({:.1} a stream) in {:.1} s: {events_rate:.0}/s; first event p50 {:.1} ms p99 {:.1} ms; last event p50 {:.0} ms p99 {:.0} ms ({:.0} and {:.0} above the model time); receipts {receipt_count}, orders without exactly the receipt their stream answered {mismatched}; RSS idle {:.1} MiB, peak {:.1} MiB: {per_stream:.0} B a stream (peak at {} streams {:.1} MiB: {slope:.0} B a stream more); service CPU {:.2} s over {span_s:.1} s ({:.2} cores, {:.2} ms a stream){}; load generator CPU {:.0} ms",
                report.sent,
                report.answers,
                report.max_in_flight,
                streams.finished,
                streams.ended_otherwise,
                streams.events,
                streams.events as f64 / streams.streams.max(1) as f64,
                streams.span_ms / 1000.0,
                streams.first_event.p50,
                streams.first_event.p99,
                streams.last_event.p50,
                streams.last_event.p99,
                streams.last_event.p50 - model_ms,
                streams.last_event.p99 - model_ms,
                idle as f64 / MIB,
                hwm as f64 / MIB,
                STREAMS / 5,
                low_hwm as f64 / MIB,
                cpu.as_secs_f64(),
                cpu.as_secs_f64() / span_s,
                cpu.as_secs_f64() * 1000.0 / STREAMS as f64,
                db_load.map_or(String::new(), |l| format!(
                    "; Postgres: {} transactions ({:.0}/s, {:.1} a stream), its backends' CPU {:.2} s ({:.2} cores)",
                    l.transactions,
                    l.transactions as f64 / span_s,
                    l.transactions as f64 / STREAMS as f64,
                    l.backend_cpu.as_secs_f64(),
                    l.backend_cpu.as_secs_f64() / span_s,
                )),
                report.cpu_ms,
            ));
            if !report.errors.is_empty() {
                self.note(&format!("  failures: {:?}", report.errors));
            }
            for (k, v) in [
                ("finished", streams.finished as f64),
                ("max_in_flight", report.max_in_flight as f64),
                ("receipts", receipt_count as f64),
                ("mismatched", mismatched as f64),
                ("idle", idle as f64 / MIB),
                ("hwm", hwm as f64 / MIB),
                ("per_stream", per_stream),
                ("slope", slope),
                ("low_hwm", low_hwm as f64 / MIB),
                ("first_p50", streams.first_event.p50),
                ("first_p99", streams.first_event.p99),
                ("last_p50", streams.last_event.p50 - model_ms),
                ("last_p99", streams.last_event.p99 - model_ms),
                (
                    "events_per_stream",
                    streams.events as f64 / streams.streams.max(1) as f64,
                ),
                ("events_rate", events_rate),
                ("cores", cpu.as_secs_f64() / span_s),
                (
                    "cpu_per_stream",
                    cpu.as_secs_f64() * 1000.0 / STREAMS as f64,
                ),
            ] {
                m.entry(k).or_default().push(v);
            }
            if let Some(l) = db_load {
                m.entry("db_rate")
                    .or_default()
                    .push(l.transactions as f64 / span_s);
                m.entry("db_per_stream")
                    .or_default()
                    .push(l.transactions as f64 / STREAMS as f64);
                m.entry("db_cores")
                    .or_default()
                    .push(l.backend_cpu.as_secs_f64() / span_s);
            }
            details.push(json!({
                "run": run,
                "warmup": warm,
                "load": report,
                "rss_bytes": {"idle": idle, "hwm": hwm, "hwm_at_a_fifth": low_hwm},
                "service_cpu_s": cpu.as_secs_f64(),
                "receipts": receipt_count,
                "mismatched": mismatched,
                "db": db_load.map(|l| json!({
                    "transactions": l.transactions,
                    "backend_cpu_s": l.backend_cpu.as_secs_f64(),
                })),
            }));
        }
        let mut take = |k: &str| m.remove(k).unwrap_or_default();
        let n = STREAMS as f64;
        let c = format!(
            "({STREAMS} at once, 2x{} ms model, HTTP/2)",
            plan.model_delay_ms
        );
        self.metrics.extend([
            Metric::new(
                12,
                &format!("streams ending RUN_FINISHED success {c}"),
                d,
                "",
                take("finished"),
            )
            .target_every_run(Target::Exactly(n)),
            Metric::new(
                12,
                "streams in flight at once, max",
                d,
                "",
                take("max_in_flight"),
            ),
            Metric::new(
                12,
                "receipts of the streamed orders",
                d,
                "",
                take("receipts"),
            )
            .target_every_run(Target::Exactly(n)),
            Metric::new(
                12,
                "orders without exactly the receipt their stream answered",
                d,
                "",
                take("mismatched"),
            )
            .target_every_run(Target::Exactly(0.0)),
            Metric::new(
                12,
                "service idle RSS (after the warm-up)",
                d,
                "MiB",
                take("idle"),
            ),
            Metric::new(12, "service peak RSS (VmHWM)", d, "MiB", take("hwm")),
            Metric::new(
                12,
                "service bytes per waiting stream ((VmHWM - idle) / 10,000)",
                d,
                "B",
                take("per_stream"),
            )
            .target(Target::AtMost(BYTES_TARGET)),
            Metric::new(
                12,
                &format!(
                    "service peak RSS, {} streams (a fresh process)",
                    STREAMS / 5
                ),
                d,
                "MiB",
                take("low_hwm"),
            ),
            Metric::new(
                12,
                &format!(
                    "service bytes per waiting stream, slope (VmHWM {} -> {STREAMS})",
                    STREAMS / 5
                ),
                d,
                "B",
                take("slope"),
            ),
            Metric::new(12, "time to first event p50", d, "ms", take("first_p50")),
            Metric::new(12, "time to first event p99", d, "ms", take("first_p99")),
            Metric::new(
                12,
                "last event above model time p50",
                d,
                "ms",
                take("last_p50"),
            ),
            Metric::new(
                12,
                "last event above model time p99",
                d,
                "ms",
                take("last_p99"),
            ),
            Metric::new(12, "events per stream", d, "", take("events_per_stream")),
            Metric::new(
                12,
                "events delivered per second",
                d,
                "1/s",
                take("events_rate"),
            ),
            Metric::new(12, "service CPU over the load", d, "cores", take("cores")),
            Metric::new(
                12,
                "service CPU per stream",
                d,
                "ms",
                take("cpu_per_stream"),
            ),
        ]);
        let db_rate = take("db_rate");
        if !db_rate.is_empty() {
            self.metrics.extend([
                Metric::new(
                    12,
                    "database transactions/s over the load",
                    d,
                    "1/s",
                    db_rate,
                ),
                Metric::new(
                    12,
                    "database transactions per stream",
                    d,
                    "",
                    take("db_per_stream"),
                ),
                Metric::new(
                    12,
                    "database backends' CPU over the load",
                    d,
                    "cores",
                    take("db_cores"),
                ),
            ]);
        }
        self.details.insert(format!("streams/{d}"), json!(details));
        Ok(())
    }
}
