//! Figure 7: instructions and heap allocations per checkout, counted by valgrind: figures
//! that do not move with the machine's load, where CPU time on a shared 2-core machine
//! swings by 20 % between runs.
//!
//! The service runs under callgrind (instructions executed) or dhat (heap blocks
//! allocated); the scripted model is a process of its own, so only the service is
//! counted. One run sends a few checkouts, another many, one at a time over one
//! keep-alive connection, each run from a fresh start; the difference between the two
//! totals over the difference in checkouts is the cost of one checkout, with start-up,
//! warm-up and shutdown cancelled out. Keyless and keyed (an Idempotency-Key: the
//! record, its lease and the saved answer), on each database.

use super::*;

#[derive(Clone, Copy)]
enum Tool {
    Callgrind,
    Dhat,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Callgrind => "callgrind",
            Tool::Dhat => "dhat",
        }
    }
}

impl Bench {
    /// The service under `tool`, `checkouts` sent to it: the tool's total.
    fn counted(
        &self,
        db: &Db,
        tool: Tool,
        keyed: bool,
        checkouts: u32,
        tag: &str,
    ) -> Result<u64, String> {
        let model = child::model(&self.env, "model-counts", 0, "")?;
        let out = self.env.work.join(format!("{tag}.{}", tool.name()));
        let wrapper = vec![
            "valgrind".to_owned(),
            format!("--tool={}", tool.name()),
            format!("--{}-out-file={}", tool.name(), out.display()),
        ];
        let mut command =
            child::service_command_under(&self.env, &wrapper, &db.service_url, &model.url);
        command.envs(self.plan.service_env.iter().map(|(k, v)| (k, v)));
        let name = format!("service-{tag}");
        let service = child::start(&self.env, &name, command, "listening on http://")?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let sent = self.rt.block_on(async {
            let http = reqwest::Client::builder()
                .http1_only()
                .build()
                .map_err(|e| e.to_string())?;
            for i in 0..checkouts {
                let url = format!("{}/checkout?orderId={tag}-{i}&amount=1.00", service.url);
                let mut request = http.post(url);
                if keyed {
                    request = request.header("Idempotency-Key", format!("{tag}-{i}"));
                }
                let status = request.send().await.map_err(|e| e.to_string())?.status();
                if status != 200 {
                    return Err(format!("checkout {i} of {tag} answered {status}"));
                }
            }
            Ok(())
        });
        let log = service.log.clone();
        service.stop_within(Duration::from_secs(120));
        model.stop();
        sent?;
        match tool {
            Tool::Callgrind => {
                let text =
                    std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
                text.lines()
                    .find_map(|l| l.strip_prefix("totals: ").or(l.strip_prefix("summary: ")))
                    .and_then(|n| n.trim().parse().ok())
                    .ok_or_else(|| format!("no totals in {}", out.display()))
            }
            // "==PID== Total:     1,234 bytes in 56 blocks" on the service's log.
            Tool::Dhat => {
                let text = std::fs::read_to_string(&log).map_err(|e| e.to_string())?;
                text.lines()
                    .find_map(|l| l.split("Total:").nth(1)?.split(" in ").nth(1))
                    .and_then(|n| {
                        n.trim()
                            .trim_end_matches(" blocks")
                            .replace(',', "")
                            .parse()
                            .ok()
                    })
                    .ok_or_else(|| format!("no dhat totals in {}", log.display()))
            }
        }
    }

    /// Figure 7: instructions and heap blocks per checkout, keyless and keyed.
    pub(super) fn counts(&mut self, db: &Db) -> Result<(), String> {
        let (few, many) = if self.plan.quick { (5, 25) } else { (10, 110) };
        for keyed in [false, true] {
            let kind = if keyed { "keyed" } else { "keyless" };
            for (tool, what, unit) in [
                (Tool::Callgrind, "instructions", "instructions"),
                (Tool::Dhat, "heap allocations", "blocks"),
            ] {
                let tag = |n: u32| format!("n{}{}{}{n}", tool.name(), db.name, kind);
                let small = self.counted(db, tool, keyed, few, &tag(few))?;
                let large = self.counted(db, tool, keyed, many, &tag(many))?;
                let per = large.saturating_sub(small) as f64 / f64::from(many - few);
                self.note(&format!(
                    "{what} per checkout, {kind}, {}: {per:.0} ({small} for {few} checkouts, {large} for {many})",
                    db.name
                ));
                self.metrics.push(Metric::new(
                    7,
                    &format!("{what} per checkout, {kind}"),
                    db.name,
                    unit,
                    vec![per],
                ));
            }
        }
        Ok(())
    }
}
