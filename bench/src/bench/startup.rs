//! Figure 4: start-up to ready.

use super::*;

impl Bench {
    /// One start: process start to the first 200 from /health/ready.
    fn start_once(&self, db: &Db, model_url: &str) -> Result<Duration, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = self
            .env
            .work
            .join(format!("service-startup-{}.log", db.name));
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut command = child::service_command(&self.env, &db.service_url, model_url);
        command.envs(self.plan.service_env.iter().map(|(k, v)| (k, v)));
        command
            .env("CHECKOUT_LISTEN", &addr)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| e.to_string())?)
            .stderr(file);
        let started = Instant::now();
        let mut process = command.spawn().map_err(|e| e.to_string())?;
        let result = loop {
            if let Ok((200, _)) = http_get(&addr, "/health/ready") {
                break Ok(started.elapsed());
            }
            if let Ok(Some(status)) = process.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                break Err(format!(
                    "the service exited with {status}:\n{}",
                    child::tail(&text)
                ));
            }
            if started.elapsed() > Duration::from_secs(20) {
                break Err("the service was not ready within 20 s".into());
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        let _ = process.kill();
        let _ = process.wait();
        result
    }

    /// Figure 4: start-up to ready, migrations already applied.
    pub(super) fn startup(&mut self, db: &Db) -> Result<(), String> {
        let model = child::model(&self.env, "model-startup", 0, "")?;
        // One start first, not counted: the binary and the database files in the cache.
        self.start_once(db, &model.url)?;
        let mut times = Vec::new();
        for _ in 0..self.plan.startup_runs {
            times.push(ms(self.start_once(db, &model.url)?));
        }
        model.stop();
        self.note(&format!("start-up {}: {times:.1?} ms", db.name));
        let target = if db.name == "sqlite" { 100.0 } else { 300.0 };
        self.metrics.push(
            Metric::new(4, "start-up to /health/ready", db.name, "ms", times)
                .target(Target::AtMost(target)),
        );
        Ok(())
    }
}
