//! Figure 8: overload. Twice as many checkouts offered at once as the service admits
//! (`CHECKOUT_MAX_IN_FLIGHT`), against the scripted model with its slow answers as in
//! figure 2: the admitted checkouts are served as if the others were not there, the
//! others are refused at once with 503 `overloaded`, nothing else is answered, and the
//! service's memory stays within the bound's budget.
//!
//! Closed loop as figure 2: each worker sends a checkout, waits for its answer, sends the
//! next; a worker refused waits the `Retry-After` it was given before its next (a
//! well-behaved client; without the wait, the refused half would spin on 2 cores and
//! measure the machine, not the service).

use super::*;

/// The memory one loop in flight holds, measured in issue 21 (figure 2 at 10,000 to
/// 100,000 in flight): the budget of a bound of N loops is N x this over the idle process.
const BYTES_PER_LOOP: f64 = 42_000.0;

impl Bench {
    /// Figure 8: twice the bound on loops offered at once.
    pub(super) fn overload(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let limit = plan.overload_limit;
        let offered = 2 * limit;
        let model_ms = plan.model_time_ms();
        let mut m: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut runs = Vec::new();
        let mut service_env = plan.service_env.clone();
        service_env.retain(|(k, _)| k != "CHECKOUT_MAX_IN_FLIGHT");
        service_env.push(("CHECKOUT_MAX_IN_FLIGHT".into(), limit.to_string()));
        if plan.loops_http2 {
            service_env.push(("CHECKOUT_MODEL_H2C".into(), "true".into()));
        }
        for run in 1..=plan.overload_runs {
            let model = child::model(&self.env, "model-overload", plan.model_delay_ms, "")?;
            let svc = child::service(
                &self.env,
                &format!("service-overload-{}", db.name),
                &db.service_url,
                &model.url,
                &service_env,
            )?;
            let sized = loops_limit(&svc)?;
            if sized < limit as u64 {
                self.note(&format!(
                    "overload {}: the service lowered CHECKOUT_MAX_IN_FLIGHT {limit} to {sized} (descriptors); the budget and the bound are its {sized}",
                    db.name
                ));
            }
            let idle_rss = procfs::status_kb(svc.pid(), "VmRSS").unwrap_or(0);
            let sampler = Sampler::start(svc.pid(), db);
            let gauge_peak = GaugePeak::start(&svc, "checkout_loops_in_flight");
            let mut load = LoadArgs::new(&svc.url, offered, &format!("o{run}"));
            load.ramp_ms = plan.loops_ramp_ms;
            load.window_start_ms = plan.loops_window_start(model_ms);
            load.duration_ms = Some(load.window_start_ms + plan.overload_window_ms);
            load.http2 = plan.loops_http2;
            load.honor_retry_after = true;
            let requests_before = model_requests(&model)?;
            let report = child::load(&self.env, "load-overload", &load)?;
            let requests = model_requests(&model)? - requests_before;
            let in_flight_peak = gauge_peak.finish();
            let hwm = procfs::status_kb(svc.pid(), "VmHWM").unwrap_or(0);
            let peak = sampler.finish();
            let refusals_counted = gauge_sum(&svc, "checkout_refusals_total{code=\"overloaded\"}");
            svc.stop();
            model.stop();

            let refused = report.answers.get("503 overloaded").copied().unwrap_or(0);
            let admitted = report.sent - refused;
            let others: u64 = report
                .answers
                .iter()
                .filter(|(k, _)| *k != "200" && *k != "503 overloaded")
                .map(|(_, n)| n)
                .sum();
            let success = 100.0 * report.ok as f64 / admitted.max(1) as f64;
            let by = |k: &str| report.window_latency_by_answer.get(k).cloned();
            let ok_latency = by("200").unwrap_or_default();
            let refused_latency = by("503 overloaded").unwrap_or_default();
            let p99_admitted = ok_latency.p99 - model_ms;
            let throughput = report.window_ok as f64 / (report.window_ms / 1000.0);
            let ideal = sized as f64 / (model_ms / 1000.0);
            let rss_mib = hwm as f64 / 1048576.0;
            let budget_mib = (sized as f64 * BYTES_PER_LOOP + idle_rss as f64) / 1048576.0;
            self.note(&format!(
                "overload {} run {run}: limit {sized}, {offered} offered (max in flight at the client {}), {} sent; answers {:?}; admitted {admitted}: {success:.2} % ok, p99 above model time {p99_admitted:.0} ms (n {}), throughput {throughput:.0}/s of the bound's {ideal:.0}/s; refused {refused} (counted by the service: {}): p50 {:.1} ms p99 {:.1} ms max {:.1} ms (n {}), {} Retry-After waits; loops in flight peak {in_flight_peak} (gauge, every 100 ms); peak RSS {rss_mib:.0} MiB of a budget of {budget_mib:.0} MiB ({sized} x 42 KB + idle {:.0} MiB); fds {}; model requests per 200 {:.3}; load generator CPU {:.0} ms",
                db.name,
                report.max_in_flight,
                report.sent,
                report.answers,
                ok_latency.n,
                refusals_counted.map_or("?".to_owned(), |n| format!("{n:.0}")),
                refused_latency.p50,
                refused_latency.p99,
                refused_latency.max,
                refused_latency.n,
                report.retry_after_waits,
                idle_rss as f64 / 1048576.0,
                peak.fds,
                requests as f64 / report.ok.max(1) as f64,
                report.cpu_ms,
            ));
            if !report.errors.is_empty() {
                self.note(&format!("  other answers: {:?}", report.errors));
            }
            m.entry("success").or_default().push(success);
            m.entry("p99").or_default().push(p99_admitted);
            m.entry("p50").or_default().push(ok_latency.p50 - model_ms);
            m.entry("refused_p99")
                .or_default()
                .push(refused_latency.p99);
            m.entry("refused_share")
                .or_default()
                .push(100.0 * refused as f64 / report.sent.max(1) as f64);
            m.entry("others").or_default().push(others as f64);
            m.entry("ratio").or_default().push(throughput / ideal);
            m.entry("in_flight").or_default().push(in_flight_peak);
            m.entry("rss").or_default().push(rss_mib);
            m.entry("budget").or_default().push(budget_mib);
            m.entry("rss_ratio").or_default().push(rss_mib / budget_mib);
            runs.push(json!({
                "limit": sized,
                "offered": offered,
                "load": report,
                "peak": peak,
                "loops_in_flight_peak": in_flight_peak,
                "refusals_counted": refusals_counted,
                "vm_hwm_bytes": hwm,
                "idle_rss_bytes": idle_rss,
                "budget_mib": budget_mib,
                "model_requests": requests,
            }));
        }
        let d = db.name;
        let mut take = |k: &str| m.remove(k).unwrap_or_default();
        let name = |s: &str| format!("{s} (limit {limit}, {offered} offered)");
        let budget = take("budget");
        let budget_median = Metric::new(8, "", d, "", budget.clone()).median;
        self.metrics.extend([
            Metric::new(8, &name("admitted: success"), d, "%", take("success"))
                .target_every_run(Target::AtLeast(100.0)),
            Metric::new(
                8,
                "admitted: p50 latency above model time",
                d,
                "ms",
                take("p50"),
            ),
            Metric::new(
                8,
                "admitted: p99 latency above model time",
                d,
                "ms",
                take("p99"),
            )
            .target(Target::AtMost(200.0)),
            Metric::new(
                8,
                "admitted: throughput / the bound's ideal",
                d,
                "x",
                take("ratio"),
            ),
            Metric::new(
                8,
                "refused 503 overloaded: p99 latency",
                d,
                "ms",
                take("refused_p99"),
            )
            .target(Target::AtMost(10.0)),
            Metric::new(
                8,
                "refused: share of answers",
                d,
                "%",
                take("refused_share"),
            ),
            Metric::new(
                8,
                "answers other than 200 and 503 overloaded",
                d,
                "",
                take("others"),
            )
            .target_every_run(Target::Exactly(0.0)),
            Metric::new(8, "loops in flight, peak (gauge)", d, "", take("in_flight"))
                .target_every_run(Target::AtMost(limit as f64)),
            Metric::new(8, "service peak RSS (VmHWM)", d, "MiB", take("rss"))
                .target(Target::AtMost(budget_median)),
            Metric::new(8, "RSS budget (limit x 42 KB + idle)", d, "MiB", budget),
            Metric::new(8, "peak RSS / budget", d, "x", take("rss_ratio"))
                .target_every_run(Target::AtMost(1.0)),
        ]);
        self.details.insert(format!("overload/{d}"), json!(runs));
        Ok(())
    }
}

/// The highest value of a gauge in the service's `/metrics`, read every 100 ms.
struct GaugePeak {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<f64>,
}

impl GaugePeak {
    fn start(service: &Running, name: &'static str) -> GaugePeak {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let addr = addr_of(&service.url);
        let handle = std::thread::spawn(move || {
            let mut peak: f64 = 0.0;
            while !flag.load(Ordering::Relaxed) {
                if let Some(v) = read_gauge(&addr, name) {
                    peak = peak.max(v);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        GaugePeak { stop, handle }
    }

    fn finish(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or(f64::NAN)
    }
}

fn read_gauge(addr: &str, name: &str) -> Option<f64> {
    let (status, body) = http_get(addr, "/metrics").ok()?;
    if status != 200 {
        return None;
    }
    metric_value(&body, name)
}

/// A series of the service's `/metrics` (its name with labels), if present.
fn gauge_sum(service: &Running, series: &str) -> Option<f64> {
    read_gauge(&addr_of(&service.url), series)
}
