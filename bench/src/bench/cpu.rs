//! Figure 1: CPU per checkout against its floor, keyless and keyed (an `Idempotency-Key`
//! on every checkout, against a floor with the bare SQL a keyed checkout needs).

use super::*;

impl Bench {
    /// Figure 1: CPU per checkout against the floor, 64 concurrent, instant model.
    pub(super) fn cpu(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let wire = plan.wire.as_str();
        let (mut service, mut axum, mut pair, mut sql, mut floor, mut ratio, mut rate) =
            (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        let (mut hyper_pair, mut hyper_ratio) = (vec![], vec![]);
        let (mut keyed, mut keyed_sql, mut keyed_floor, mut keyed_ratio, mut keyed_rate) =
            (vec![], vec![], vec![], vec![], vec![]);
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
            let (svc_load, svc_cpu) = self.measured_load(&svc, &format!("c{run}"), false)?;
            // The same process, then keyed: a fresh key (the order id) per checkout.
            let (keyed_load, keyed_cpu) = self.measured_load(&svc, &format!("k{run}"), true)?;
            svc.stop();
            let floor_axum = child::floor_axum(&self.env)?;
            let (axum_load, axum_cpu) =
                self.measured_load(&floor_axum, &format!("a{run}"), false)?;
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
                &span(&["floor-reqwest", "--model", &model.url, "--wire", wire]),
            )?;
            // A reference beside the floor: the pair by hyper's client, the service's.
            let hyper: FloorReport = child::run_json(
                &self.env,
                "floor-hyper",
                &span(&[
                    "floor-reqwest",
                    "--model",
                    &model.url,
                    "--hyper",
                    "--wire",
                    wire,
                ]),
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
            // A keyed checkout's bare SQL: the record's insert, the receipt, the record's
            // completion with the answer, each a statement and a commit of its own.
            let keyed_statements: FloorReport = child::run_json(
                &self.env,
                "floor-sql-keyed",
                &span(&[
                    "floor-sql",
                    "--keyed",
                    "--database",
                    &db.floor_url,
                    "--prefix",
                    &format!("fk{run}"),
                ]),
            )?;
            let s = ms(svc_cpu) * 1000.0 / svc_load.ok as f64;
            let k = ms(keyed_cpu) * 1000.0 / keyed_load.ok as f64;
            let kq = keyed_statements.cpu_per_op_us();
            let a = ms(axum_cpu) * 1000.0 / axum_load.ok as f64;
            let p = reqwest.cpu_per_op_us();
            let q = statement.cpu_per_op_us();
            let h = hyper.cpu_per_op_us();
            self.note(&format!(
                "cpu {} run {run}: service {s:.1} us/checkout ({} checkouts, {:.0}/s, p50 {:.2} ms, p99 {:.2} ms); floor: axum {a:.1} + 2 POSTs {p:.1} + sql {q:.1} = {:.1} us; ratio {:.2} (2 hyper POSTs {h:.1}: ratio {:.2})",
                db.name,
                svc_load.ok,
                svc_load.ok as f64 / svc_load.wall_ms * 1000.0,
                svc_load.latency.p50,
                svc_load.latency.p99,
                a + p + q,
                s / (a + p + q),
                s / (a + h + q)
            ));
            self.note(&format!(
                "cpu {} run {run}: keyed service {k:.1} us/checkout ({} checkouts, {:.0}/s, p50 {:.2} ms, p99 {:.2} ms); keyed floor: axum {a:.1} + 2 POSTs {p:.1} + sql {kq:.1} = {:.1} us; ratio {:.2}",
                db.name,
                keyed_load.ok,
                keyed_load.ok as f64 / keyed_load.wall_ms * 1000.0,
                keyed_load.latency.p50,
                keyed_load.latency.p99,
                a + p + kq,
                k / (a + p + kq),
            ));
            keyed.push(k);
            keyed_sql.push(kq);
            keyed_floor.push(a + p + kq);
            keyed_ratio.push(k / (a + p + kq));
            keyed_rate.push(keyed_load.ok as f64 / keyed_load.wall_ms * 1000.0);
            service.push(s);
            axum.push(a);
            pair.push(p);
            sql.push(q);
            floor.push(a + p + q);
            ratio.push(s / (a + p + q));
            hyper_pair.push(h);
            hyper_ratio.push(s / (a + h + q));
            rate.push(svc_load.ok as f64 / svc_load.wall_ms * 1000.0);
            runs.push(json!({
                "service": {"load": svc_load, "cpu_ms": ms(svc_cpu)},
                "axum": {"load": axum_load, "cpu_ms": ms(axum_cpu)},
                "reqwest_pairs": reqwest,
                "hyper_pairs": hyper,
                "sql_statements": statement,
                "keyed": {"load": keyed_load, "cpu_ms": ms(keyed_cpu)},
                "keyed_sql_statements": keyed_statements,
            }));
        }
        let d = db.name;
        self.metrics.extend([
            Metric::new(1, "CPU per checkout, service", d, "us", service),
            Metric::new(1, "floor: bare axum handler", d, "us", axum),
            Metric::new(1, "floor: 2 bare reqwest POSTs", d, "us", pair),
            Metric::new(1, "floor: bare sqlx charge", d, "us", sql),
            Metric::new(1, "floor, total", d, "us", floor),
            Metric::new(1, "ratio service / floor", d, "x", ratio).target(Target::AtMost(1.3)),
            Metric::new(1, "checkouts/s at 64 (instant model)", d, "1/s", rate),
            Metric::new(1, "reference: 2 bare hyper POSTs", d, "us", hyper_pair),
            Metric::new(
                1,
                "reference: ratio with the hyper pair",
                d,
                "x",
                hyper_ratio,
            ),
            Metric::new(1, "CPU per keyed checkout, service", d, "us", keyed),
            Metric::new(
                1,
                "keyed floor: bare sqlx record insert + receipt + completion",
                d,
                "us",
                keyed_sql,
            ),
            Metric::new(1, "keyed floor, total", d, "us", keyed_floor),
            Metric::new(1, "keyed ratio service / floor", d, "x", keyed_ratio)
                .target(Target::AtMost(1.3)),
            Metric::new(
                1,
                "keyed checkouts/s at 64 (instant model)",
                d,
                "1/s",
                keyed_rate,
            ),
        ]);
        self.details.insert(format!("cpu/{d}"), json!(runs));
        Ok(())
    }
}
