//! Figure 2: loops in flight against a slow model, and the memory one waiting loop
//! holds against its floor.
//!
//! The memory per waiting loop is a slope: the peak RSS (`VmHWM`) of a fresh process
//! under the figure's load at two concurrencies (a fifth of the figure's, and the
//! figure's), the difference over the difference in loops, so that what the process
//! holds idle and what warm-up allocates once cancel out. The same for the floor
//! (`checkout-bench floor-loop`: a bare axum handler making the checkout's two bare
//! reqwest POSTs to the same slow model), under the same load.

use super::*;

/// Over HTTP/2, the most one waiting loop may add to the service's peak RSS (issue 22).
const LOOP_BYTES_TARGET: f64 = 16_384.0;

/// Over HTTP/1.1, the most one waiting loop of the service may hold against one of the
/// floor's (issue 22).
const LOOP_RATIO_TARGET: f64 = 1.3;

/// What one load of the figure's shape left on the process under it.
struct Point {
    loops: usize,
    report: LoadReport,
    hwm: u64,
    idle_rss: u64,
}

impl Point {
    fn json(&self) -> Value {
        json!({
            "loops": self.loops,
            "vm_hwm_bytes": self.hwm,
            "idle_rss_bytes": self.idle_rss,
            "load": self.report,
        })
    }
}

/// Bytes per loop between two points.
fn slope(low: &Point, high: &Point) -> f64 {
    (high.hwm as f64 - low.hwm as f64) / (high.loops as f64 - low.loops as f64)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// The process a memory point measures.
enum Under<'a> {
    Service {
        db: &'a Db,
        env: &'a [(String, String)],
    },
    Floor,
}

impl Bench {
    /// The figure's load on `url`: the workers started over the ramp, a window after
    /// it, over HTTP/2 unless `--http1`. A worker refused (503 `overloaded`, when the
    /// service's bound is below the concurrency) waits its `Retry-After` before its
    /// next checkout instead of spinning on the 2 cores.
    fn loops_load(
        &self,
        url: &str,
        concurrency: usize,
        window_ms: u64,
        prefix: &str,
        name: &str,
    ) -> Result<LoadReport, String> {
        let plan = &self.plan;
        let mut load = LoadArgs::new(url, concurrency, prefix);
        load.ramp_ms = plan.loops_ramp_ms;
        load.window_start_ms = plan.loops_window_start(plan.model_time_ms());
        load.duration_ms = Some(load.window_start_ms + window_ms);
        load.http2 = plan.loops_http2;
        load.honor_retry_after = true;
        child::load(&self.env, name, &load)
    }

    /// A fresh slow model and a fresh service or floor under the figure's load of
    /// `loops` workers: the process's peak RSS.
    fn memory_point(&self, under: &Under, loops: usize, prefix: &str) -> Result<Point, String> {
        let plan = &self.plan;
        let model = child::model(&self.env, "model-slow", plan.model_delay_ms, "")?;
        let process = match under {
            Under::Service { db, env } => child::service(
                &self.env,
                &format!("service-loops-{}-{loops}", db.name),
                &db.service_url,
                &model.url,
                env,
            )?,
            Under::Floor => child::floor_loop(
                &self.env,
                &format!("floor-loop-{loops}"),
                &model.url,
                plan.loops_http2,
                plan.wire,
            )?,
        };
        let idle_rss = procfs::status_kb(process.pid(), "VmRSS").unwrap_or(0);
        let report = self.loops_load(
            &process.url,
            loops,
            plan.loops_window_ms,
            prefix,
            "load-loops-memory",
        )?;
        let hwm = procfs::status_kb(process.pid(), "VmHWM").unwrap_or(0);
        process.stop();
        model.stop();
        Ok(Point {
            loops,
            report,
            hwm,
            idle_rss,
        })
    }

    /// Figure 2: many loops in flight against a slow model.
    pub(super) fn loops(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let c = plan.loops_concurrency;
        let low = c / 5;
        let model_ms = plan.model_time_ms();
        let mut m: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut runs = Vec::new();
        let mut service_env = plan.service_env.clone();
        // Every one of the figure's loops is admitted: the bound on loops in flight is
        // raised to the concurrency when it is above the default (10,000), unless
        // `--service-env CHECKOUT_MAX_IN_FLIGHT=N` says otherwise.
        if !service_env
            .iter()
            .any(|(k, _)| k == "CHECKOUT_MAX_IN_FLIGHT")
        {
            service_env.push(("CHECKOUT_MAX_IN_FLIGHT".into(), c.max(10_000).to_string()));
        }
        if plan.loops_http2 {
            service_env.push(("CHECKOUT_MODEL_H2C".into(), "true".into()));
        }
        // The bound the service sized, the lowest of the runs (the same in each).
        let mut admitted_at_once = c;
        // The concurrencies of the memory slope: the low and the high.
        let mut slope_at = (low, c);
        for run in 1..=plan.loops_runs {
            let model = child::model(&self.env, "model-slow", plan.model_delay_ms, "")?;
            let svc = child::service(
                &self.env,
                &format!("service-loops-{}", db.name),
                &db.service_url,
                &model.url,
                &service_env,
            )?;
            let limit = loops_limit(&svc)?;
            let admitted = c.min(usize::try_from(limit).unwrap_or(usize::MAX));
            admitted_at_once = admitted_at_once.min(admitted);
            if admitted < c {
                self.note(&format!(
                    "loops {} run {run}: the service admits {limit} loops at once, fewer than the {c} offered (its descriptor limit lowered the bound; see its start-up line in {}): the rest are answered 503 overloaded and wait its Retry-After; success and latency below are the admitted checkouts', the ideal throughput the {admitted} admitted loops'",
                    db.name,
                    svc.log.display()
                ));
            }
            let idle_rss = procfs::status_kb(svc.pid(), "VmRSS").unwrap_or(0);
            let sampler = Sampler::start(svc.pid(), db);
            // With every loop admitted, checkouts end at an even rate after the ramp. With
            // some refused, the admitted workers keep their places: their checkouts end at
            // the ramp's rate (c / ramp) for admitted / c of each model time, then not at
            // all, and a window shorter than a model time would count the rate of the
            // busy part alone. So the window is then a whole number of model times.
            let window_ms = if admitted < c {
                let period = model_ms as u64;
                plan.loops_window_ms.div_ceil(period).max(1) * period
            } else {
                plan.loops_window_ms
            };
            let requests_before = model_requests(&model)?;
            let report =
                self.loops_load(&svc.url, c, window_ms, &format!("l{run}"), "load-loops")?;
            let requests = model_requests(&model)? - requests_before;
            let hwm = procfs::status_kb(svc.pid(), "VmHWM").unwrap_or(0);
            let peak = sampler.finish();
            let log = std::fs::read_to_string(&svc.log).unwrap_or_default();
            svc.stop();
            model.stop();
            // Refused checkouts are counted apart: a refusal is the bound at work, not a
            // failed checkout, and its answer (in a millisecond) is no loop's latency.
            let refused = report.answers.get("503 overloaded").copied().unwrap_or(0);
            let success = 100.0 * report.ok as f64 / (report.sent - refused).max(1) as f64;
            let throughput = report.window_ok as f64 / (report.window_ms / 1000.0);
            if window_ms != plan.loops_window_ms {
                self.note(&format!(
                    "loops {} run {run}: throughput over a window of {window_ms} ms (a whole number of model times), not {} ms",
                    db.name, plan.loops_window_ms
                ));
            }
            let ideal = admitted as f64 / (model_ms / 1000.0);
            // The latency of the checkouts answered 200 in the window; none: no figure.
            let ok_latency = report
                .window_latency_by_answer
                .get("200")
                .filter(|p| p.n > 0);
            let p50 = ok_latency.map_or(f64::NAN, |p| p.p50 - model_ms);
            let p99 = ok_latency.map_or(f64::NAN, |p| p.p99 - model_ms);
            self.note(&format!(
                "loops {} run {run}: {c} concurrent (max in flight {}, the service's bound {limit}), {} sent, answers {:?}: {success:.2} % of the admitted ok, {refused} refused; throughput {throughput:.0}/s of ideal {ideal:.0}/s, overhead (200s in the window, n {}) p50 {p50:.0} ms p99 {p99:.0} ms, peak RSS {:.0} MiB, fds {}, db connections {}, model requests/checkout {:.3}; load generator CPU {:.0} ms",
                db.name,
                report.max_in_flight,
                report.sent,
                report.answers,
                ok_latency.map_or(0, |p| p.n),
                mib(hwm),
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

            // The memory per waiting loop: the service and the floor, each fresh, at a
            // fifth of the loops and at the loops the service admits at once (the run
            // above when it admits them all; else a run offered no more than it admits,
            // as a run with refusals also holds the refused workers' connections).
            let high = Point {
                loops: c,
                report: report.clone(),
                hwm,
                idle_rss,
            };
            let memory = if low == 0 || low >= admitted {
                self.note(&format!(
                    "loops {} run {run}: no memory slope: {low} and {admitted} loops are no two concurrencies",
                    db.name
                ));
                None
            } else {
                let under = Under::Service {
                    db,
                    env: &service_env,
                };
                let points = (|| {
                    let service_low = self.memory_point(&under, low, &format!("m{run}"))?;
                    let service_high = if admitted < c {
                        self.memory_point(&under, admitted, &format!("n{run}"))?
                    } else {
                        high
                    };
                    let floor_low = self.memory_point(&Under::Floor, low, "fl")?;
                    let floor_high = self.memory_point(&Under::Floor, admitted, "fh")?;
                    Ok::<_, String>([service_low, service_high, floor_low, floor_high])
                })();
                match points {
                    Ok(points) => Some(points),
                    Err(err) => {
                        self.note(&format!(
                            "loops {} run {run}: memory per waiting loop FAILED: {err}",
                            db.name
                        ));
                        self.details
                            .insert(format!("loops/{}/memory/error", db.name), json!(err));
                        None
                    }
                }
            };
            if let Some(points) = &memory {
                let [service_low, service_high, floor_low, floor_high] = points;
                slope_at = (low, admitted);
                let (service, floor) = (
                    slope(service_low, service_high),
                    slope(floor_low, floor_high),
                );
                self.note(&format!(
                    "loops {} run {run}: bytes per waiting loop, {low} -> {admitted} loops (VmHWM): service {:.1} -> {:.1} MiB = {service:.0} B/loop; floor (bare axum + 2 reqwest POSTs) {:.1} -> {:.1} MiB = {floor:.0} B/loop; service / floor {:.2}",
                    db.name,
                    mib(service_low.hwm),
                    mib(service_high.hwm),
                    mib(floor_low.hwm),
                    mib(floor_high.hwm),
                    service / floor,
                ));
                for point in points {
                    let r = &point.report;
                    let failed = r.sent - r.ok;
                    if failed > 0 || (r.max_in_flight as usize) < point.loops {
                        self.note(&format!(
                            "  a memory point at {} loops: {failed} of {} not answered 200 {:?}, max in flight {}: the slope counts loops that were not all waiting",
                            point.loops, r.sent, r.answers, r.max_in_flight
                        ));
                    }
                }
                for (name, value) in [
                    ("service_low_rss", mib(service_low.hwm)),
                    ("service_high_rss", mib(service_high.hwm)),
                    ("floor_low_rss", mib(floor_low.hwm)),
                    ("floor_high_rss", mib(floor_high.hwm)),
                    ("service_slope", service),
                    ("floor_slope", floor),
                    ("slope_ratio", service / floor),
                ] {
                    m.entry(name).or_default().push(value);
                }
            }

            m.entry("success").or_default().push(success);
            m.entry("refused").or_default().push(refused as f64);
            m.entry("ratio").or_default().push(throughput / ideal);
            m.entry("p50").or_default().push(p50);
            m.entry("p99").or_default().push(p99);
            m.entry("rss").or_default().push(mib(hwm));
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
                "loops_in_flight_limit": limit,
                "model_requests": requests,
                "memory_per_loop": memory.as_ref().map(|[sl, sh, fl, fh]| json!({
                    "service": {"low": sl.json(), "high": if admitted < c { sh.json() } else { json!("the run above") }, "bytes_per_loop": slope(sl, sh)},
                    "floor": {"low": fl.json(), "high": fh.json(), "bytes_per_loop": slope(fl, fh)},
                })),
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
        let refusing = admitted_at_once < c;
        self.metrics.extend([Metric::new(
            2,
            &name(if refusing {
                "success of the admitted"
            } else {
                "success"
            }),
            d,
            "%",
            take("success"),
        )
        .target_every_run(Target::AtLeast(100.0))]);
        let refused = take("refused");
        if refusing {
            self.metrics.push(Metric::new(
                2,
                &format!("refused 503 overloaded (the service admits {admitted_at_once} at once)"),
                d,
                "",
                refused,
            ));
        }
        let ideal_name = if refusing {
            format!("throughput / ideal of the {admitted_at_once} admitted")
        } else {
            "throughput / ideal".to_owned()
        };
        self.metrics.extend([
            Metric::new(2, "throughput", d, "1/s", take("tput")),
            Metric::new(2, &ideal_name, d, "x", take("ratio")).target(Target::AtLeast(0.9)),
            Metric::new(2, "p50 latency above model time", d, "ms", take("p50")),
            Metric::new(2, "p99 latency above model time", d, "ms", take("p99"))
                .target(Target::AtMost(200.0)),
            Metric::new(2, "service peak RSS (VmHWM)", d, "MiB", take("rss"))
                .target(Target::AtMost(256.0)),
            Metric::new(2, "database connections used", d, "", take("conns")),
            Metric::new(2, "service open descriptors, peak", d, "", take("fds")),
        ]);
        let service_slope = take("service_slope");
        if !service_slope.is_empty() {
            let (lo, hi) = slope_at;
            let service = Metric::new(
                2,
                &format!("service bytes per waiting loop ({protocol}, VmHWM {lo} -> {hi} loops)"),
                d,
                "B",
                service_slope,
            );
            let ratio = Metric::new(
                2,
                &format!("bytes per waiting loop, service / floor ({protocol})"),
                d,
                "x",
                take("slope_ratio"),
            );
            // The targets of issue 22: bytes over HTTP/2, the ratio over HTTP/1.1.
            let (service, ratio) = if plan.loops_http2 {
                (service.target(Target::AtMost(LOOP_BYTES_TARGET)), ratio)
            } else {
                (service, ratio.target(Target::AtMost(LOOP_RATIO_TARGET)))
            };
            self.metrics.extend([
                Metric::new(
                    2,
                    &format!("service peak RSS, {lo} loops waiting"),
                    d,
                    "MiB",
                    take("service_low_rss"),
                ),
                Metric::new(
                    2,
                    &format!("service peak RSS, {hi} loops waiting"),
                    d,
                    "MiB",
                    take("service_high_rss"),
                ),
                Metric::new(
                    2,
                    &format!("floor peak RSS, {lo} loops waiting"),
                    d,
                    "MiB",
                    take("floor_low_rss"),
                ),
                Metric::new(
                    2,
                    &format!("floor peak RSS, {hi} loops waiting"),
                    d,
                    "MiB",
                    take("floor_high_rss"),
                ),
                service,
                Metric::new(
                    2,
                    &format!(
                        "floor bytes per waiting loop ({protocol}, bare axum + 2 reqwest POSTs)"
                    ),
                    d,
                    "B",
                    take("floor_slope"),
                ),
                ratio,
            ]);
        }
        self.details.insert(format!("loops/{d}"), json!(runs));
        Ok(())
    }
}
