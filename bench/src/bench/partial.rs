//! Figure 10: partial faults. A model endpoint that answers a random share of its
//! requests 503 (0 to 50 %), alone or with a healthy fallback, with the circuit breaker
//! at its defaults and off: the checkouts answered 200, the model requests a checkout
//! takes (both endpoints), and p99 latency. A defence is judged first by what it does to
//! a provider that is not down: the target is success with 20 % errors on one endpoint,
//! at least 99.9 %, breaker on.

use super::*;

/// The error rates, in percent.
const RATES: [u32; 5] = [0, 10, 20, 30, 50];

impl Bench {
    pub(super) fn partial(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let requests = if plan.quick { 500 } else { 2_000 };
        let concurrency = 32;
        let mut details = Vec::new();
        let mut panels = Vec::new();
        for fallback in [false, true] {
            let mut success_series = Vec::new();
            for breaker in [true, false] {
                let mut points = Vec::new();
                for rate in RATES {
                    let faults = if rate == 0 {
                        String::new()
                    } else {
                        format!("503%{rate}")
                    };
                    let model =
                        child::model(&self.env, &format!("model-partial-{rate}"), 0, &faults)?;
                    let second = match fallback {
                        true => Some(child::model(&self.env, "model-partial-fallback", 0, "")?),
                        false => None,
                    };
                    let mut extra = plan.service_env.clone();
                    if !breaker {
                        // Off in effect: a window no run fills, every request failed.
                        extra.push(("CHECKOUT_BREAKER_WINDOW".into(), "10000".into()));
                        extra.push(("CHECKOUT_BREAKER_FAILURE_PERCENT".into(), "100".into()));
                    }
                    if let Some(second) = &second {
                        extra.push(("OPENAI_FALLBACK_BASE_URL".into(), second.url.clone()));
                    }
                    let svc = child::service(
                        &self.env,
                        &format!("service-partial-{}", db.name),
                        &db.service_url,
                        &model.url,
                        &extra,
                    )?;
                    let prefix = format!(
                        "p{}{}{rate}",
                        if fallback { "f" } else { "o" },
                        if breaker { "b" } else { "n" }
                    );
                    let mut load = LoadArgs::new(&svc.url, concurrency, &prefix);
                    load.requests = Some(requests);
                    let report = child::load(&self.env, "load-partial", &load)?;
                    let asked =
                        model_requests(&model)? + second.as_ref().map_or(Ok(0), model_requests)?;
                    svc.stop();
                    model.stop();
                    if let Some(second) = second {
                        second.stop();
                    }
                    let success = 100.0 * report.ok as f64 / report.sent.max(1) as f64;
                    let per_checkout = asked as f64 / report.sent.max(1) as f64;
                    let receipts = self.receipts(db, &prefix)?;
                    let charged: usize = receipts.values().map(Vec::len).sum();
                    let setup = format!(
                        "{} endpoint{}, breaker {}",
                        if fallback {
                            "primary + fallback"
                        } else {
                            "one"
                        },
                        if fallback { "s" } else { "" },
                        if breaker { "on" } else { "off" }
                    );
                    self.note(&format!(
                        "partial {} {setup}, {rate} % 503: {} of {} ok ({success:.2} %), {per_checkout:.2} model requests a checkout, p99 {:.1} ms, {charged} receipts; {:?}",
                        db.name, report.ok, report.sent, report.latency.p99, report.answers
                    ));
                    if charged as u64 != report.ok {
                        return Err(format!(
                            "{setup}, {rate} %: {charged} receipts for {} checkouts answered 200",
                            report.ok
                        ));
                    }
                    points.push((f64::from(rate), success));
                    let name = |what: &str| format!("{what}, {setup}, {rate} % 503");
                    let mut success_metric =
                        Metric::new(10, &name("success"), db.name, "%", vec![success]);
                    if rate == 20 && breaker && !fallback {
                        success_metric = success_metric.target(Target::AtLeast(99.9));
                    }
                    self.metrics.push(success_metric);
                    self.metrics.push(Metric::new(
                        10,
                        &name("model requests per checkout"),
                        db.name,
                        "",
                        vec![per_checkout],
                    ));
                    self.metrics.push(Metric::new(
                        10,
                        &name("p99"),
                        db.name,
                        "ms",
                        vec![report.latency.p99],
                    ));
                    details.push(json!({
                        "fallback": fallback, "breaker": breaker, "rate": rate,
                        "load": report, "model_requests": asked, "receipts": charged,
                    }));
                }
                success_series.push(svg::Series {
                    label: format!("breaker {}", if breaker { "on (defaults)" } else { "off" }),
                    color: if breaker { "#1f77b4" } else { "#d62728" },
                    dashed: !breaker,
                    points,
                });
            }
            panels.push(svg::Panel {
                title: format!(
                    "{}: checkouts answered 200",
                    if fallback {
                        "with a healthy fallback"
                    } else {
                        "one endpoint"
                    }
                ),
                y_label: "% answered 200 (x: % of requests answered 503)".into(),
                series: success_series,
                limit: (!fallback).then(|| (99.9, "target at 20 %: 99.9".into())),
            });
        }
        self.details
            .insert(format!("partial/{}", db.name), Value::Array(details));
        let path = self.env.out.join(format!(
            "partial-{}{}.svg",
            db.name,
            if plan.quick { "-quick" } else { "" }
        ));
        std::fs::create_dir_all(&self.env.out).map_err(|e| e.to_string())?;
        let caption = format!(
            "checkout-bench{} --only partial, {}: {requests} checkouts at {concurrency} in flight per point, instant scripted model answering a random share of requests 503",
            if plan.quick { " --quick" } else { "" },
            db.name,
        );
        std::fs::write(&path, svg::render(&panels, &caption))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        self.note(&format!("wrote {}", path.display()));
        Ok(())
    }
}
