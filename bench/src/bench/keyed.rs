//! Figure 13: keyed checkouts in flight. Every checkout with an `Idempotency-Key` of its
//! own (a fresh key and order per request, as a client following the docs sends them),
//! at rising concurrency against an instant model: throughput and latency, and keyless
//! at 64 in flight in the same run, for the latency target (issue 34).

use super::*;

/// Where the throughput target starts: each point from here on at least this share of
/// the best point below it (from this one up).
const FROM: usize = 16;
const SHARE: f64 = 0.9;
/// The concurrency whose latency is compared with keyless latency.
const AT: usize = 64;

impl Bench {
    pub(super) fn keyed(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let d = db.name;
        let points = &plan.keyed_in_flight;
        let (mut rate, mut mean, mut p99) = (
            vec![vec![]; points.len()],
            vec![vec![]; points.len()],
            vec![vec![]; points.len()],
        );
        let (mut keyless_rate, mut keyless_mean, mut worst_share, mut latency_ratio) =
            (vec![], vec![], vec![], vec![]);
        let mut detail = Vec::new();
        for run in 1..=plan.keyed_runs {
            let model = child::model(&self.env, "model-keyed", 0, "")?;
            let svc = child::service(
                &self.env,
                &format!("service-keyed-{d}"),
                &db.service_url,
                &model.url,
                &self.plan.service_env,
            )?;
            let measure = |c: usize, keyed: bool, prefix: &str| {
                let mut load = LoadArgs::new(&svc.url, c, prefix);
                load.keyed = keyed;
                load.window_start_ms = plan.keyed_warmup_ms;
                load.duration_ms = Some(plan.keyed_warmup_ms + plan.keyed_window_ms);
                let r = child::load(&self.env, "load-keyed", &load)?;
                if r.ok != r.sent {
                    return Err(format!(
                        "{} of {} keyed={keyed} checkouts at {c} in flight failed: {:?} {:?}",
                        r.sent - r.ok,
                        r.sent,
                        r.answers,
                        r.errors
                    ));
                }
                Ok::<LoadReport, String>(r)
            };
            let keyless = measure(AT, false, &format!("kl{run}"))?;
            let keyless_rate_run = keyless.window_ok as f64 / keyless.window_ms * 1000.0;
            let mut run_rates = Vec::new();
            let mut run_means = Vec::new();
            for (i, &c) in points.iter().enumerate() {
                let r = measure(c, true, &format!("kf{run}-{c}"))?;
                let per_s = r.window_ok as f64 / r.window_ms * 1000.0;
                self.note(&format!(
                    "keyed {d} run {run}: {c} in flight: {per_s:.0}/s, latency mean {:.2} ms p50 {:.2} ms p99 {:.2} ms (n {})",
                    r.window_latency.mean,
                    r.window_latency.p50,
                    r.window_latency.p99,
                    r.window_latency.n
                ));
                rate[i].push(per_s);
                mean[i].push(r.window_latency.mean);
                p99[i].push(r.window_latency.p99);
                run_rates.push((c, per_s));
                run_means.push((c, r.window_latency.mean));
                detail.push(json!({"run": run, "keyed": true, "concurrency": c, "load": r}));
            }
            svc.stop();
            model.stop();
            // Each point from FROM on against the best point below it, from FROM up.
            let mut best = f64::NAN;
            let mut worst = f64::INFINITY;
            for &(_, per_s) in run_rates.iter().filter(|(c, _)| *c >= FROM) {
                if best.is_finite() {
                    worst = worst.min(per_s / best);
                }
                best = if best.is_finite() {
                    best.max(per_s)
                } else {
                    per_s
                };
            }
            let keyed_at = run_means.iter().find(|(c, _)| *c == AT).map(|p| p.1);
            let ratio = keyed_at.map_or(f64::NAN, |k| k / keyless.window_latency.mean);
            self.note(&format!(
                "keyed {d} run {run}: keyless at {AT} in flight {keyless_rate_run:.0}/s, latency mean {:.2} ms; keyed / keyless latency at {AT}: {ratio:.2}; least point / best below it ({FROM} up): {worst:.2}",
                keyless.window_latency.mean
            ));
            keyless_rate.push(keyless_rate_run);
            keyless_mean.push(keyless.window_latency.mean);
            worst_share.push(worst);
            latency_ratio.push(ratio);
            detail.push(json!({"run": run, "keyed": false, "concurrency": AT, "load": keyless}));
        }
        let median = |v: &Vec<f64>| Metric::new(13, "", d, "", v.clone()).median;
        for (i, &c) in points.iter().enumerate() {
            self.keyed_points
                .push((0, format!("{d} keyed"), c as f64, median(&rate[i])));
            self.keyed_points
                .push((1, format!("{d} keyed mean"), c as f64, median(&mean[i])));
            self.keyed_points
                .push((1, format!("{d} keyed p99"), c as f64, median(&p99[i])));
        }
        for (i, &c) in points.iter().enumerate() {
            self.metrics.push(Metric::new(
                13,
                &format!("keyed checkouts/s, {c} in flight"),
                d,
                "1/s",
                rate[i].clone(),
            ));
        }
        for (i, &c) in points.iter().enumerate() {
            self.metrics.push(Metric::new(
                13,
                &format!("keyed latency (mean), {c} in flight"),
                d,
                "ms",
                mean[i].clone(),
            ));
        }
        self.metrics.extend([
            Metric::new(
                13,
                &format!("keyless checkouts/s, {AT} in flight (same run)"),
                d,
                "1/s",
                keyless_rate,
            ),
            Metric::new(
                13,
                &format!("keyless latency (mean), {AT} in flight (same run)"),
                d,
                "ms",
                keyless_mean,
            ),
            Metric::new(
                13,
                &format!("keyed throughput: least point / best point below it ({FROM} up)"),
                d,
                "x",
                worst_share,
            )
            .target(Target::AtLeast(SHARE)),
            Metric::new(
                13,
                &format!("keyed / keyless latency (mean), {AT} in flight"),
                d,
                "x",
                latency_ratio,
            )
            .target(Target::AtMost(2.0)),
        ]);
        self.details.insert(format!("keyed/{d}"), json!(detail));
        Ok(())
    }

    /// The figure's SVG: keyed throughput, and keyed latency (mean and p99), against the
    /// checkouts in flight.
    pub(super) fn keyed_plot(&self) -> String {
        let mut panels = vec![
            svg::Panel {
                title: "keyed: throughput (instant model)".into(),
                y_label: "checkouts/s".into(),
                series: vec![],
                limit: None,
            },
            svg::Panel {
                title: "keyed: latency (instant model)".into(),
                y_label: "latency, ms".into(),
                series: vec![],
                limit: None,
            },
        ];
        plot_points(&mut panels, self.keyed_points.clone());
        let caption = format!(
            "checkout-bench{} --only keyed: {} (a fresh Idempotency-Key per checkout)",
            if self.plan.quick { " --quick" } else { "" },
            procfs::machine()
        );
        svg::render(&panels, &caption)
    }
}
