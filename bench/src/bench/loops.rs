//! Figure 2: loops in flight against a slow model.

use super::*;

impl Bench {
    /// Figure 2: many loops in flight against a slow model.
    pub(super) fn loops(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let c = plan.loops_concurrency;
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
            if limit < c as u64 {
                self.note(&format!(
                    "loops {} run {run}: the service admits {limit} loops at once, fewer than the {c} offered (its descriptor limit lowered the bound; see its start-up line in {}): the rest are answered 503 overloaded",
                    db.name,
                    svc.log.display()
                ));
            }
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
                "loops {} run {run}: {c} concurrent (max in flight {}, the service's bound {limit}), {} sent, {success:.2} % ok {:?}, throughput {throughput:.0}/s of ideal {ideal:.0}/s, overhead p50 {p50:.0} ms p99 {p99:.0} ms, peak RSS {:.0} MiB, fds {}, db connections {}, model requests/checkout {:.3}; load generator CPU {:.0} ms",
                db.name,
                report.max_in_flight,
                report.sent,
                report.answers,
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
                "loops_in_flight_limit": limit,
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
}
