//! Figure 9: an outage of the primary model endpoint. Two scripted models, the primary
//! and a healthy fallback (`OPENAI_FALLBACK_BASE_URL`); a closed-loop load; partway, the
//! primary's process is stopped (its port refuses connections) and, after the outage
//! window, started again on the same port. The same load without the outage is the
//! healthy run. The service's `/metrics` is read every 100 ms: requests sent to each
//! endpoint (`gen_ai_client_operation_duration_seconds_count`, failed ones included),
//! checkouts answered 200 (`checkout_checkouts_total{code="ok"}`) and the primary's
//! breaker state (`checkout_model_breaker_state`, endpoint `primary#1`), for the numbers and the timeline
//! (`outage.svg`). The breaker's open time is shortened (`CHECKOUT_BREAKER_OPEN_MS`,
//! [`OPEN_MS`]) so that the figure shows it open, probe and close within seconds.

use super::*;

/// The breaker's open time in this figure (the service's default is 5000 ms).
const OPEN_MS: u64 = 1000;
/// How often `/metrics` is read.
const SAMPLE_MS: u64 = 100;

/// One reading of the service's `/metrics`.
#[derive(Clone, Debug, Serialize)]
struct Reading {
    /// Since the load started.
    t_ms: f64,
    ok: f64,
    primary: f64,
    fallback: f64,
    /// Trial requests so far: the primary's breaker's transitions to half open (a trial
    /// lasts one request, shorter than a reading's interval).
    trials: f64,
    /// The primary's breaker: `closed`, `open`, `half_open` (empty if unreadable).
    breaker: String,
}

fn read_metrics(addr: &str, t_ms: f64) -> Option<Reading> {
    let (status, body) = http_get(addr, "/metrics").ok()?;
    if status != 200 {
        return None;
    }
    let value = |line: &str| {
        line.rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let mut r = Reading {
        t_ms,
        ok: 0.0,
        primary: 0.0,
        fallback: 0.0,
        trials: 0.0,
        breaker: String::new(),
    };
    for line in body.lines() {
        if line.starts_with("checkout_checkouts_total{") && line.contains("code=\"ok\"") {
            r.ok += value(line);
        } else if line.starts_with("gen_ai_client_operation_duration_seconds_count{") {
            if line.contains("gen_ai_request_model=\"primary\"") {
                r.primary += value(line);
            } else if line.contains("gen_ai_request_model=\"fallback\"") {
                r.fallback += value(line);
            }
        } else if line.starts_with("checkout_model_breaker_transitions_total{")
            && line.contains("#1\"")
            && line.contains("to=\"half_open\"")
        {
            r.trials += value(line);
        } else if let Some(state) = line
            .strip_prefix("checkout_model_breaker_state{")
            .filter(|_| line.contains("#1\"") && value(line) == 1.0)
            .and_then(|rest| rest.split("state=\"").nth(1))
            .and_then(|s| s.split('"').next())
        {
            r.breaker = state.to_owned();
        }
    }
    Some(r)
}

/// What one run saw.
struct Run {
    load: LoadReport,
    readings: Vec<Reading>,
    /// When the primary was stopped and started again (ms since the load started).
    down_ms: f64,
    up_ms: f64,
    /// `/metrics` read just before the stop and just before the restart.
    at_down: Option<Reading>,
    at_up: Option<Reading>,
    records: PathBuf,
    prefix: String,
}

impl Bench {
    fn outage_run(&self, db: &Db, run: usize, outage: bool) -> Result<Run, String> {
        let plan = &self.plan;
        let label = if outage { "outage" } else { "healthy" };
        let primary = child::model(
            &self.env,
            &format!("model-primary-{label}"),
            plan.outage_model_delay_ms,
            "",
        )?;
        let fallback = child::model(
            &self.env,
            &format!("model-fallback-{label}"),
            plan.outage_model_delay_ms,
            "",
        )?;
        let mut extra = plan.service_env.clone();
        extra.extend(
            [
                ("OPENAI_MODEL", "primary".to_owned()),
                ("OPENAI_FALLBACK_BASE_URL", fallback.url.clone()),
                ("OPENAI_FALLBACK_MODEL", "fallback".to_owned()),
                ("CHECKOUT_BREAKER_OPEN_MS", OPEN_MS.to_string()),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let svc = child::service(
            &self.env,
            &format!("service-outage-{}-{label}", db.name),
            &db.service_url,
            &primary.url,
            &extra,
        )?;
        let total_ms = plan.outage_before_ms + plan.outage_window_ms + plan.outage_after_ms;
        let prefix = format!("o{}{run}", if outage { "o" } else { "h" });
        let records = self
            .env
            .work
            .join(format!("records-{}-{prefix}.tsv", db.name));
        let mut load = LoadArgs::new(&svc.url, plan.outage_concurrency, &prefix);
        load.duration_ms = Some(total_ms);
        load.records = Some(records.clone());

        let start = Instant::now();
        let env = self.env.clone();
        let loader = std::thread::spawn(move || child::load(&env, "load-outage", &load));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let stop = stop.clone();
            let addr = addr_of(&svc.url);
            std::thread::spawn(move || {
                let mut readings = Vec::new();
                let mut next = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let t = start.elapsed();
                    if let Some(r) = read_metrics(&addr, ms(t)) {
                        readings.push(r);
                    }
                    next += Duration::from_millis(SAMPLE_MS);
                    if let Some(wait) = next.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                readings
            })
        };
        let sleep_until = |at_ms: u64| {
            if let Some(wait) = Duration::from_millis(at_ms).checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        };
        let (mut down_ms, mut up_ms) = (f64::NAN, f64::NAN);
        let mut restarted = None;
        let (mut at_down, mut at_up) = (None, None);
        let svc_addr = addr_of(&svc.url);
        if outage {
            let addr = addr_of(&primary.url);
            sleep_until(plan.outage_before_ms);
            down_ms = ms(start.elapsed());
            at_down = read_metrics(&svc_addr, down_ms);
            primary.stop_within(Duration::from_secs(1));
            sleep_until(plan.outage_before_ms + plan.outage_window_ms);
            at_up = read_metrics(&svc_addr, ms(start.elapsed()));
            restarted = Some(child::model_on(
                &self.env,
                "model-primary-restarted",
                &addr,
                plan.outage_model_delay_ms,
                "",
            )?);
            up_ms = ms(start.elapsed());
        }
        let load = loader
            .join()
            .map_err(|_| "the load thread panicked".to_owned())??;
        // One more reading after the last answer.
        std::thread::sleep(Duration::from_millis(SAMPLE_MS));
        stop.store(true, Ordering::Relaxed);
        let readings = sampler
            .join()
            .map_err(|_| "the sampler panicked".to_owned())?;
        svc.stop();
        drop(restarted);
        drop(fallback);
        Ok(Run {
            load,
            readings,
            down_ms,
            up_ms,
            at_down,
            at_up,
            records,
            prefix,
        })
    }

    /// Figure 9: the primary endpoint down for a window, a healthy fallback.
    pub(super) fn outage(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let mut m: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut details = Vec::new();
        for run in 1..=plan.outage_runs {
            let healthy = self.outage_run(db, run, false)?;
            let outage = self.outage_run(db, run, true)?;
            let r = &outage.readings;
            // The last reading at or before `t`, else the first.
            let at = |t: f64| {
                r.iter()
                    .rev()
                    .find(|x| x.t_ms <= t)
                    .or(r.first())
                    .cloned()
                    .ok_or("no reading of /metrics")
            };
            let down = outage
                .at_down
                .clone()
                .map_or_else(|| at(outage.down_ms), Ok)?;
            let up = outage.at_up.clone().map_or_else(|| at(outage.up_ms), Ok)?;
            let to_primary = up.primary - down.primary;
            let to_fallback = up.fallback - down.fallback;
            let opened = r
                .iter()
                .find(|x| x.t_ms >= outage.down_ms && x.breaker == "open")
                .map(|x| x.t_ms - outage.down_ms);
            // Back on the primary: the first reading after the restart with the breaker
            // closed and a request more to the primary than at the restart.
            let back = r
                .iter()
                .find(|x| x.t_ms >= outage.up_ms && x.breaker == "closed" && x.primary > up.primary)
                .map(|x| x.t_ms - outage.up_ms);
            let success = 100.0 * outage.load.ok as f64 / outage.load.sent.max(1) as f64;
            let healthy_success = 100.0 * healthy.load.ok as f64 / healthy.load.sent.max(1) as f64;
            // Every order answered 200 has exactly one receipt, the one it was shown.
            let receipts = self.receipts(db, &outage.prefix)?;
            let text = std::fs::read_to_string(&outage.records).map_err(|e| e.to_string())?;
            let mut mismatched = 0u64;
            for line in text.lines() {
                let f: Vec<&str> = line.split('\t').collect();
                let found = receipts.get(f[0]).map(Vec::as_slice).unwrap_or(&[]);
                if f[1] == "200" && found != [f[2].to_owned()] {
                    mismatched += 1;
                }
            }
            let (p50, p99) = (
                outage.load.latency.p50 / healthy.load.latency.p50.max(1e-9),
                outage.load.latency.p99 / healthy.load.latency.p99.max(1e-9),
            );
            self.note(&format!(
                "outage {} run {run}: {} of {} answered 200 ({success:.1} %; healthy run {} of {}); primary down {:.0}..{:.0} ms: {to_primary} requests to the primary, {to_fallback} to the fallback in the window; breaker open {} ms after the stop; back on the primary {} ms after the restart (open time {OPEN_MS} ms); p50 {:.1} ms p99 {:.1} ms (healthy {:.1} / {:.1}: x{p50:.2} / x{p99:.2}); 200s without exactly their receipt: {mismatched}; load average {}",
                db.name,
                outage.load.ok,
                outage.load.sent,
                healthy.load.ok,
                healthy.load.sent,
                outage.down_ms,
                outage.up_ms,
                opened.map_or("never".into(), |v| format!("{v:.0}")),
                back.map_or("never".into(), |v| format!("{v:.0}")),
                outage.load.latency.p50,
                outage.load.latency.p99,
                healthy.load.latency.p50,
                healthy.load.latency.p99,
                load_average()
            ));
            if !outage.load.errors.is_empty() {
                self.note(&format!("  failures: {:?}", outage.load.errors));
            }
            m.entry("success").or_default().push(success);
            m.entry("healthy_success")
                .or_default()
                .push(healthy_success);
            m.entry("to_primary").or_default().push(to_primary);
            m.entry("p50").or_default().push(p50);
            m.entry("p99").or_default().push(p99);
            m.entry("back")
                .or_default()
                .push(back.unwrap_or(f64::INFINITY));
            m.entry("mismatched").or_default().push(mismatched as f64);
            details.push(json!({
                "healthy": healthy.load, "outage": outage.load,
                "down_ms": outage.down_ms, "up_ms": outage.up_ms,
                "requests_to_primary_in_window": to_primary,
                "requests_to_fallback_in_window": to_fallback,
                "breaker_open_after_stop_ms": opened, "back_on_primary_after_restart_ms": back,
                "mismatched": mismatched, "readings": outage.readings,
            }));
            if run == plan.outage_runs {
                let path = self.env.out.join(format!(
                    "outage-{}{}.svg",
                    db.name,
                    if plan.quick { "-quick" } else { "" }
                ));
                std::fs::create_dir_all(&self.env.out).map_err(|e| e.to_string())?;
                let caption = format!(
                    "checkout-bench{} --only outage, {}: {} closed-loop checkouts, {} ms model, breaker open time {OPEN_MS} ms; {}",
                    if plan.quick { " --quick" } else { "" },
                    db.name,
                    plan.outage_concurrency,
                    plan.outage_model_delay_ms,
                    load_average()
                );
                std::fs::write(&path, timeline(&outage, &caption))
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                self.note(&format!("wrote {}", path.display()));
            }
        }
        // At most: the checkouts in flight at the stop (each may have a request at the
        // primary), the breaker's window (20 outcomes: at most 20 failed ones before it
        // opens), and one trial per open time over the outage window.
        let bound =
            plan.outage_concurrency as f64 + 20.0 + (plan.outage_window_ms / OPEN_MS) as f64 + 1.0;
        let d = db.name;
        let mut take = |k: &str| m.remove(k).unwrap_or_default();
        self.metrics.extend([
            Metric::new(9, "success with the primary down", d, "%", take("success"))
                .target_every_run(Target::Exactly(100.0)),
            Metric::new(9, "success, healthy run", d, "%", take("healthy_success")),
            Metric::new(
                9,
                "requests to the primary while down",
                d,
                "",
                take("to_primary"),
            )
            .target(Target::AtMost(bound)),
            Metric::new(9, "p50 latency, outage / healthy", d, "x", take("p50")),
            Metric::new(9, "p99 latency, outage / healthy", d, "x", take("p99")),
            Metric::new(
                9,
                "back on the primary after its restart",
                d,
                "ms",
                take("back"),
            )
            .target(Target::AtMost((OPEN_MS + 500) as f64)),
            Metric::new(
                9,
                "200s without exactly their receipt",
                d,
                "",
                take("mismatched"),
            )
            .target_every_run(Target::Exactly(0.0)),
        ]);
        self.details.insert(format!("outage/{d}"), json!(details));
        Ok(())
    }
}

/// `/proc/loadavg`'s first three fields: how busy the machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Per second over the last 500 ms, at each reading.
fn rate(readings: &[Reading], value: impl Fn(&Reading) -> f64) -> Vec<(f64, f64)> {
    let span = (500 / SAMPLE_MS) as usize;
    (1..readings.len())
        .map(|i| {
            let j = i.saturating_sub(span);
            let (a, b) = (&readings[j], &readings[i]);
            let dt = (b.t_ms - a.t_ms).max(1.0) / 1000.0;
            (b.t_ms, (value(b) - value(a)) / dt)
        })
        .collect()
}

/// The timeline: requests per second to each endpoint and checkouts answered 200 per
/// second, over bands for the outage window and the primary's breaker state.
fn timeline(run: &Run, caption: &str) -> String {
    let r = &run.readings;
    let series = [
        (
            "requests/s to the primary",
            "#d62728",
            rate(r, |x| x.primary),
        ),
        (
            "requests/s to the fallback",
            "#1f77b4",
            rate(r, |x| x.fallback),
        ),
        ("checkouts answered 200/s", "#2ca02c", rate(r, |x| x.ok)),
    ];
    let bands: Vec<(f64, f64, String)> = {
        let mut bands = Vec::new();
        let mut start = 0;
        for i in 1..=r.len() {
            if i == r.len() || r[i].breaker != r[start].breaker {
                let end = r.get(i).map_or(r[i - 1].t_ms, |x| x.t_ms);
                bands.push((r[start].t_ms, end, r[start].breaker.clone()));
                start = i;
            }
        }
        bands
    };
    let trials: Vec<f64> = r
        .windows(2)
        .filter(|w| w[1].trials > w[0].trials)
        .map(|w| w[1].t_ms)
        .collect();
    svg::timeline(
        &series
            .iter()
            .map(|(l, c, p)| (l.to_string(), *c, p.clone()))
            .collect::<Vec<_>>(),
        &bands,
        &trials,
        (run.down_ms, run.up_ms),
        "the primary endpoint down, a healthy fallback",
        caption,
    )
}
