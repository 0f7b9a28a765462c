//! Figure 3: retry amplification, and receipts per order.

use super::*;

impl Bench {
    /// Receipts of the orders `prefix-*`: order id → receipt ids.
    pub(super) fn receipts(
        &self,
        db: &Db,
        prefix: &str,
    ) -> Result<HashMap<String, Vec<String>>, String> {
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
    pub(super) fn retry(&mut self, db: &Db) -> Result<(), String> {
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
}
