//! The plot: latency against concurrency.

use super::*;

impl Bench {
    /// The plot's points: latency against concurrency, instant and slow model.
    pub(super) fn sweep(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let model = child::model(&self.env, "model-sweep-instant", 0, "")?;
        let svc = child::service(
            &self.env,
            &format!("service-sweep-{}", db.name),
            &db.service_url,
            &model.url,
            &self.plan.service_env,
        )?;
        let mut detail = Vec::new();
        for &c in &plan.sweep_instant {
            let mut load = LoadArgs::new(&svc.url, c, &format!("si{c}"));
            load.duration_ms = Some(plan.sweep_instant_ms);
            let r = child::load(&self.env, "load-sweep", &load)?;
            self.note(&format!(
                "sweep {} instant model, {c} concurrent: p50 {:.2} ms p99 {:.2} ms, {:.0}/s, {} failed",
                db.name,
                r.latency.p50,
                r.latency.p99,
                r.ok as f64 / r.wall_ms * 1000.0,
                r.sent - r.ok
            ));
            let label = |q: &str| format!("{} {q}", db.name);
            self.points.push((0, label("p50"), c as f64, r.latency.p50));
            self.points.push((0, label("p99"), c as f64, r.latency.p99));
            detail.push(json!({"model_ms": 0, "concurrency": c, "load": r}));
        }
        svc.stop();
        model.stop();
        if !plan.sweep_slow.is_empty() {
            let model = child::model(&self.env, "model-sweep-slow", plan.model_delay_ms, "")?;
            let svc = child::service(
                &self.env,
                &format!("service-sweep-{}", db.name),
                &db.service_url,
                &model.url,
                &self.plan.service_env,
            )?;
            let model_ms = plan.model_time_ms();
            for &c in &plan.sweep_slow {
                let mut load = LoadArgs::new(&svc.url, c, &format!("ss{c}"));
                load.ramp_ms = plan.loops_ramp_ms;
                load.window_start_ms = plan.loops_window_start(model_ms);
                load.duration_ms = Some(load.window_start_ms + plan.sweep_slow_window_ms);
                let r = child::load(&self.env, "load-sweep", &load)?;
                let (p50, p99) = (
                    r.window_latency.p50 - model_ms,
                    r.window_latency.p99 - model_ms,
                );
                self.note(&format!(
                    "sweep {} 2x{} ms model, {c} concurrent: overhead p50 {p50:.1} ms p99 {p99:.1} ms ({} in window), {} failed",
                    db.name,
                    plan.model_delay_ms,
                    r.window_latency.n,
                    r.sent - r.ok
                ));
                self.points
                    .push((1, format!("{} p50", db.name), c as f64, p50));
                self.points
                    .push((1, format!("{} p99", db.name), c as f64, p99));
                detail.push(json!({"model_ms": model_ms, "concurrency": c, "load": r}));
            }
            svc.stop();
            model.stop();
        }
        self.details
            .insert(format!("sweep/{}", db.name), json!(detail));
        Ok(())
    }
}
