//! Figure 6: what the journal saves. Model requests and tokens per successful checkout
//! with the journal on and off, under two faults that make the loop retry step in: 20 %
//! of requests answered 503, and answers slow enough that the loop timeout cuts attempts.

use super::*;

/// A condition: its name, the scripted model's faults, and the service's settings.
type Condition = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// The faults, and the service settings that make them loop retries.
const CONDITIONS: [Condition; 2] = [
    ("20% 503", "503%20", &[]),
    (
        "loop timeouts (40% of answers 600 ms, loop timeout 1 s)",
        "slow=600%40",
        &[
            ("CHECKOUT_REQUEST_TIMEOUT_MS", "900"),
            ("CHECKOUT_LOOP_TIMEOUT_MS", "1000"),
        ],
    ),
];

impl Bench {
    pub(super) fn saving(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let mut details = Vec::new();
        for (condition, faults, settings) in CONDITIONS {
            let mut m: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
            for run in 1..=plan.retry_runs {
                for journal in [true, false] {
                    let label = if journal { "on" } else { "off" };
                    let model = child::model(&self.env, "model-saving", 0, faults)?;
                    let mut env = self.plan.service_env.clone();
                    env.push(("CHECKOUT_JOURNAL".into(), journal.to_string()));
                    env.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
                    let svc = child::service(
                        &self.env,
                        &format!("service-saving-{}", db.name),
                        &db.service_url,
                        &model.url,
                        &env,
                    )?;
                    let prefix = format!("s{}{run}{label}", faults.len());
                    let records = self
                        .env
                        .work
                        .join(format!("records-{}-{prefix}.tsv", db.name));
                    let mut load = LoadArgs::new(&svc.url, plan.retry_concurrency, &prefix);
                    load.requests = Some(plan.retry_requests / 2);
                    load.records = Some(records.clone());
                    let before = model_requests(&model)?;
                    let report = child::load(&self.env, "load-saving", &load)?;
                    let requests = model_requests(&model)? - before;
                    svc.stop();
                    model.stop();
                    let text = std::fs::read_to_string(&records).map_err(|e| e.to_string())?;
                    let tokens: u64 = text
                        .lines()
                        .map(|line| line.split('\t').collect::<Vec<_>>())
                        .filter(|f| f.get(1) == Some(&"200"))
                        .map(|f| {
                            f[4..6]
                                .iter()
                                .map(|n| n.parse::<u64>().unwrap_or(0))
                                .sum::<u64>()
                        })
                        .sum();
                    let ok = report.ok.max(1) as f64;
                    let (per_requests, per_tokens) = (requests as f64 / ok, tokens as f64 / ok);
                    let success = 100.0 * report.ok as f64 / report.sent.max(1) as f64;
                    self.note(&format!(
                        "saving {} run {run} {condition}, journal {label}: {} of {} ok ({success:.1} %), {requests} model requests = {per_requests:.3} per checkout, {per_tokens:.0} tokens per checkout",
                        db.name, report.ok, report.sent
                    ));
                    m.entry(if journal {
                        "requests_on"
                    } else {
                        "requests_off"
                    })
                    .or_default()
                    .push(per_requests);
                    m.entry(if journal { "tokens_on" } else { "tokens_off" })
                        .or_default()
                        .push(per_tokens);
                    m.entry(if journal { "success_on" } else { "success_off" })
                        .or_default()
                        .push(success);
                    details.push(
                        json!({"condition": condition, "run": run, "journal": journal,
                        "load": report, "model_requests": requests, "tokens": tokens}),
                    );
                }
            }
            let d = db.name;
            let ratio = |on: &[f64], off: &[f64]| -> Vec<f64> {
                on.iter().zip(off).map(|(a, b)| a / b).collect()
            };
            let saved_requests = ratio(&m["requests_on"], &m["requests_off"]);
            let saved_tokens = ratio(&m["tokens_on"], &m["tokens_off"]);
            let mut take = |k: &str| m.remove(k).unwrap_or_default();
            self.metrics.extend([
                Metric::new(
                    6,
                    &format!("model requests per checkout, {condition}, journal on"),
                    d,
                    "",
                    take("requests_on"),
                ),
                Metric::new(
                    6,
                    &format!("model requests per checkout, {condition}, journal off"),
                    d,
                    "",
                    take("requests_off"),
                ),
                Metric::new(
                    6,
                    &format!("journal on / off, model requests, {condition}"),
                    d,
                    "x",
                    saved_requests,
                ),
                Metric::new(
                    6,
                    &format!("tokens per checkout, {condition}, journal on"),
                    d,
                    "",
                    take("tokens_on"),
                ),
                Metric::new(
                    6,
                    &format!("tokens per checkout, {condition}, journal off"),
                    d,
                    "",
                    take("tokens_off"),
                ),
                Metric::new(
                    6,
                    &format!("journal on / off, tokens, {condition}"),
                    d,
                    "x",
                    saved_tokens,
                ),
                Metric::new(
                    6,
                    &format!("success, {condition}, journal on"),
                    d,
                    "%",
                    take("success_on"),
                ),
                Metric::new(
                    6,
                    &format!("success, {condition}, journal off"),
                    d,
                    "%",
                    take("success_off"),
                ),
            ]);
        }
        self.details
            .insert(format!("saving/{}", db.name), json!(details));
        Ok(())
    }
}
