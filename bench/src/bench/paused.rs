//! Figure 11: checkouts paused for approval (issue 31). A paused checkout is rows (its
//! approval, its Idempotency-Key record holding the 202, its journal), no task and no
//! memory: so 10,000 of them should leave the service's RSS within 10 MiB of its idle RSS,
//! and approving all 10,000 should drain them with exactly one receipt each.
//!
//! Per run, one service process (`CHECKOUT_APPROVAL_ABOVE=USD:100.00`, the scripted model
//! answering at once): a warm-up below the threshold (keyless and keyed), a settle, the
//! idle RSS; 10,000 checkouts of 500.00, fresh orders, half keyless (the service mints
//! their key) and half with an `Idempotency-Key`, 64 in flight, every one a 202
//! `requires_approval`; a settle, the paused RSS (and at 5,000, half way); then every approval approved, 64 in
//! flight, every one a 200 with `charged: true`; the receipts counted in the database;
//! a settle, the drained RSS.

use super::*;

const THRESHOLD: &str = "USD:100.00";
/// Checkouts paused per run, half keyless and half keyed.
const PAUSED: u64 = 10_000;
/// Warm-up checkouts below the threshold, half keyless and half keyed.
const WARMUP: u64 = 500;
const CONCURRENCY: usize = 64;
const AMOUNT: &str = "500.00";
const AMOUNT_MINOR: i64 = 50_000;
/// How long the service is left alone before its RSS is read.
const SETTLE_MS: u64 = 2_000;
/// The target: the paused checkouts' RSS within this of the idle RSS.
const TARGET_MIB: f64 = 10.0;
const MIB: f64 = 1024.0 * 1024.0;

/// Counts of rows whose order id is `LIKE $1` (one text for both stores).
const RECEIPTS_OF: &str =
    "SELECT count(*) FROM receipts WHERE order_id LIKE $1 AND amount_minor = $2";
const RECEIPTS: &str = "SELECT count(*) FROM receipts WHERE order_id LIKE $1";
const PENDING: &str =
    "SELECT count(*) FROM approvals WHERE order_id LIKE $1 AND status = 'pending'";

impl Bench {
    pub(super) fn paused(&mut self, db: &Db) -> Result<(), String> {
        let plan = self.plan.clone();
        let d = db.name;
        let mut m: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut details = Vec::new();
        for run in 1..=plan.paused_runs {
            let model = child::model(&self.env, "model-paused", 0, "")?;
            let mut extra = plan.service_env.clone();
            extra.push(("CHECKOUT_APPROVAL_ABOVE".into(), THRESHOLD.into()));
            let svc = child::service(
                &self.env,
                &format!("service-paused-{d}"),
                &db.service_url,
                &model.url,
                &extra,
            )?;
            let pid = svc.pid();
            let started_rss = rss(pid)?;

            // Warm-up below the threshold: both paths, so the allocator and the pools are
            // warm before the idle RSS is read.
            let mut warm_ok = 0;
            for keyed in [false, true] {
                let prefix = format!("pw{run}{}", if keyed { "k" } else { "n" });
                let mut load = LoadArgs::new(&svc.url, CONCURRENCY, &prefix);
                load.requests = Some(WARMUP / 2);
                load.keyed = keyed;
                let r = child::load(&self.env, "load-paused-warmup", &load)?;
                if r.ok != r.sent {
                    return Err(format!(
                        "warm-up: {} of {} checkouts below the threshold failed: {:?} {:?}",
                        r.sent - r.ok,
                        r.sent,
                        r.answers,
                        r.errors
                    ));
                }
                warm_ok += r.ok;
            }
            let idle = settled_rss(pid)?;

            // 10,000 checkouts above it, each a fresh order, in two halves (each a quarter
            // keyless, then a quarter keyed) with the RSS read after each: growth that goes
            // on from the first half to the second is per paused checkout, growth that
            // does not is the pause path warming up once.
            let mut approvals = Vec::new();
            let mut answered_202 = 0;
            let mut pause_ms = 0.0;
            let mut pause_loads = Vec::new();
            let mut half_rss = 0;
            for (half, keyed) in [(0, false), (0, true), (1, false), (1, true)] {
                if half == 1 && !keyed {
                    half_rss = settled_rss(pid)?;
                }
                let prefix = format!("pa{run}{}{half}", if keyed { "k" } else { "n" });
                let records = self.env.work.join(format!("records-{d}-{prefix}.tsv"));
                let mut load = LoadArgs::new(&svc.url, CONCURRENCY, &prefix);
                load.requests = Some(PAUSED / 4);
                load.keyed = keyed;
                load.amount = AMOUNT.into();
                load.records = Some(records.clone());
                let r = child::load(&self.env, "load-paused", &load)?;
                let paused = r.answers.get("202 requires_approval").copied().unwrap_or(0);
                if paused != r.sent {
                    return Err(format!(
                        "{} of {} checkouts above the threshold (keyed: {keyed}) were not paused: {:?} {:?}",
                        r.sent - paused,
                        r.sent,
                        r.answers,
                        r.errors
                    ));
                }
                answered_202 += paused;
                pause_ms += r.wall_ms;
                let text = std::fs::read_to_string(&records).map_err(|e| e.to_string())?;
                approvals.extend(
                    text.lines()
                        .filter_map(|l| l.split('\t').nth(6))
                        .filter(|id| *id != "-")
                        .map(str::to_owned),
                );
                pause_loads.push(r);
            }
            let distinct: std::collections::HashSet<&String> = approvals.iter().collect();
            if distinct.len() as u64 != PAUSED {
                return Err(format!(
                    "{} distinct approval ids in {} answers 202",
                    distinct.len(),
                    answered_202
                ));
            }
            let paused_rss = settled_rss(pid)?;
            let in_flight = gauge(&svc, "checkout_loops_in_flight")?;
            let pending = self.count(db, PENDING, &format!("pa{run}__-%"), None)?;
            self.note(&format!(
                "paused {d} run {run}: RSS at start {:.1} MiB, idle after {warm_ok} checkouts below the threshold {:.1} MiB; {answered_202} checkouts paused (202 requires_approval) in {:.1} s ({:.0}/s), {pending} approvals pending, {in_flight} loops in flight; RSS {:.1} MiB at 5,000 paused, {:.1} MiB at 10,000: {:+.2} MiB against idle ({:.0} bytes a paused checkout; from 5,000 to 10,000: {:.0})",
                started_rss as f64 / MIB,
                idle as f64 / MIB,
                pause_ms / 1000.0,
                answered_202 as f64 / pause_ms * 1000.0,
                half_rss as f64 / MIB,
                paused_rss as f64 / MIB,
                (paused_rss as f64 - idle as f64) / MIB,
                (paused_rss as f64 - idle as f64) / PAUSED as f64,
                (paused_rss as f64 - half_rss as f64) / (PAUSED / 2) as f64,
            ));

            // Approve them all.
            let ids = self.env.work.join(format!("approvals-{d}-{run}.txt"));
            std::fs::write(&ids, approvals.join("\n")).map_err(|e| e.to_string())?;
            let records = self.env.work.join(format!("records-{d}-approve{run}.tsv"));
            let mut load = LoadArgs::new(&svc.url, CONCURRENCY, "approve");
            load.requests = Some(approvals.len() as u64);
            load.approve = Some(ids);
            load.records = Some(records.clone());
            let drain = child::load(&self.env, "load-approve", &load)?;
            let text = std::fs::read_to_string(&records).map_err(|e| e.to_string())?;
            let mut charged = 0u64;
            let mut shown: HashMap<String, String> = HashMap::new();
            for line in text.lines() {
                let f: Vec<&str> = line.split('\t').collect();
                if f.len() == 5 && f[1] == "200" && f[4] == "true" {
                    charged += 1;
                    shown.insert(f[2].to_owned(), f[3].to_owned());
                }
            }
            if charged != PAUSED {
                self.note(&format!(
                    "paused {d} run {run}: only {charged} approvals answered 200 charged: true: {:?} {:?}",
                    drain.answers, drain.errors
                ));
            }
            // Every paused order has exactly one receipt of its amount, the one its approval
            // answered; the warm-up's are all there too.
            let mut receipts = HashMap::new();
            for half in ["n0", "k0", "n1", "k1"] {
                receipts.extend(self.receipts(db, &format!("pa{run}{half}"))?);
            }
            let mismatched = shown
                .iter()
                .filter(|(order, receipt)| {
                    receipts.get(*order).map(Vec::as_slice) != Some(&[(*receipt).clone()])
                })
                .count() as u64
                + (PAUSED - shown.len() as u64);
            let paused_receipts =
                self.count(db, RECEIPTS_OF, &format!("pa{run}__-%"), Some(AMOUNT_MINOR))?;
            let warm_receipts = self.count(db, RECEIPTS, &format!("pw{run}_-%"), None)?;
            let drained_rss = settled_rss(pid)?;
            let pending_after = self.count(db, PENDING, &format!("pa{run}__-%"), None)?;
            let hwm = procfs::status_kb(pid, "VmHWM").unwrap_or(0);
            svc.stop();
            model.stop();
            let drain_s = drain.wall_ms / 1000.0;
            self.note(&format!(
                "paused {d} run {run}: {} of {} approvals answered 200, {charged} of them charged: true, in {drain_s:.1} s ({:.0}/s, p50 {:.1} ms p99 {:.1} ms); receipts of {AMOUNT} for the paused orders {paused_receipts}, of the warm-up {warm_receipts}; orders without exactly the receipt their approval answered {mismatched}; pending after {pending_after}; RSS after the drain {:.1} MiB ({:+.2} MiB against idle), peak {:.1} MiB",
                drain.ok,
                drain.sent,
                charged as f64 / drain_s,
                drain.latency.p50,
                drain.latency.p99,
                drained_rss as f64 / MIB,
                (drained_rss as f64 - idle as f64) / MIB,
                hwm as f64 / MIB,
            ));
            let growth = (paused_rss as f64 - idle as f64) / MIB;
            for (k, v) in [
                ("idle", idle as f64 / MIB),
                ("paused_rss", paused_rss as f64 / MIB),
                ("growth", growth),
                ("half_rss", half_rss as f64 / MIB),
                (
                    "per_paused",
                    (paused_rss as f64 - idle as f64) / PAUSED as f64,
                ),
                (
                    "marginal",
                    (paused_rss as f64 - half_rss as f64) / (PAUSED / 2) as f64,
                ),
                ("answered_202", answered_202 as f64),
                ("pending", pending as f64),
                ("in_flight", in_flight),
                ("pause_rate", answered_202 as f64 / pause_ms * 1000.0),
                ("charged", charged as f64),
                ("paused_receipts", paused_receipts as f64),
                ("warm_receipts", warm_receipts as f64),
                ("mismatched", mismatched as f64),
                ("pending_after", pending_after as f64),
                ("drain_s", drain_s),
                ("drain_rate", charged as f64 / drain_s),
                ("drain_p99", drain.latency.p99),
                ("drained_rss", drained_rss as f64 / MIB),
                ("drained_growth", (drained_rss as f64 - idle as f64) / MIB),
                ("hwm", hwm as f64 / MIB),
            ] {
                m.entry(k).or_default().push(v);
            }
            details.push(json!({
                "run": run,
                "rss_bytes": {"start": started_rss, "idle": idle, "half_paused": half_rss, "paused": paused_rss, "drained": drained_rss, "hwm": hwm},
                "warmup_ok": warm_ok,
                "pause": pause_loads,
                "pending": pending,
                "loops_in_flight_while_paused": in_flight,
                "approve": drain,
                "charged": charged,
                "receipts": {"paused": paused_receipts, "warmup": warm_receipts, "mismatched": mismatched},
            }));
        }
        let mut take = |k: &str| m.remove(k).unwrap_or_default();
        let n = PAUSED as f64;
        self.metrics.extend([
            Metric::new(
                11,
                &format!("idle RSS (after {WARMUP} checkouts below the threshold)"),
                d,
                "MiB",
                take("idle"),
            ),
            Metric::new(
                11,
                "RSS, 5,000 checkouts paused",
                d,
                "MiB",
                take("half_rss"),
            ),
            Metric::new(
                11,
                "RSS, 10,000 checkouts paused",
                d,
                "MiB",
                take("paused_rss"),
            ),
            Metric::new(11, "RSS paused - idle", d, "MiB", take("growth"))
                .target(Target::AtMost(TARGET_MIB)),
            Metric::new(
                11,
                "bytes per paused checkout, (paused - idle) / 10,000",
                d,
                "B",
                take("per_paused"),
            ),
            Metric::new(
                11,
                "bytes per paused checkout, from 5,000 to 10,000",
                d,
                "B",
                take("marginal"),
            ),
            Metric::new(
                11,
                "checkouts answered 202 requires_approval",
                d,
                "",
                take("answered_202"),
            )
            .target_every_run(Target::Exactly(n)),
            Metric::new(11, "approvals pending (database)", d, "", take("pending"))
                .target_every_run(Target::Exactly(n)),
            Metric::new(11, "loops in flight while paused", d, "", take("in_flight"))
                .target_every_run(Target::Exactly(0.0)),
            Metric::new(
                11,
                "checkouts paused/s, 64 in flight",
                d,
                "1/s",
                take("pause_rate"),
            ),
            Metric::new(
                11,
                "approvals answered 200 charged: true",
                d,
                "",
                take("charged"),
            )
            .target_every_run(Target::Exactly(n)),
            Metric::new(
                11,
                &format!("receipts of {AMOUNT}, paused orders"),
                d,
                "",
                take("paused_receipts"),
            )
            .target_every_run(Target::Exactly(n)),
            Metric::new(11, "receipts, warm-up orders", d, "", take("warm_receipts"))
                .target_every_run(Target::Exactly(WARMUP as f64)),
            Metric::new(
                11,
                "paused orders without exactly their approval's receipt",
                d,
                "",
                take("mismatched"),
            )
            .target_every_run(Target::Exactly(0.0)),
            Metric::new(
                11,
                "approvals pending after the drain",
                d,
                "",
                take("pending_after"),
            )
            .target_every_run(Target::Exactly(0.0)),
            Metric::new(11, "drain time, 10,000 approvals", d, "s", take("drain_s")),
            Metric::new(
                11,
                "approvals/s, 64 in flight",
                d,
                "1/s",
                take("drain_rate"),
            ),
            Metric::new(11, "approval p99 latency", d, "ms", take("drain_p99")),
            Metric::new(11, "RSS after the drain", d, "MiB", take("drained_rss")),
            Metric::new(
                11,
                "RSS after the drain - idle",
                d,
                "MiB",
                take("drained_growth"),
            ),
            Metric::new(11, "peak RSS (VmHWM)", d, "MiB", take("hwm")),
        ]);
        self.details.insert(format!("paused/{d}"), json!(details));
        Ok(())
    }

    /// The count `sql` reads, `$1` the order ids' pattern and `$2`, if given, an amount.
    fn count(
        &self,
        db: &Db,
        sql: &'static str,
        pattern: &str,
        amount: Option<i64>,
    ) -> Result<i64, String> {
        macro_rules! count_on {
            ($conn:ty) => {{
                let mut conn = <$conn>::connect(&db.service_url)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut query = sqlx::query_scalar(sql).bind(pattern);
                if let Some(amount) = amount {
                    query = query.bind(amount);
                }
                query.fetch_one(&mut conn).await.map_err(|e| e.to_string())
            }};
        }
        self.rt.block_on(async {
            if db.service_url.starts_with("postgres") {
                count_on!(sqlx::PgConnection)
            } else {
                count_on!(sqlx::SqliteConnection)
            }
        })
    }
}

fn rss(pid: u32) -> Result<u64, String> {
    procfs::status_kb(pid, "VmRSS").ok_or_else(|| format!("no VmRSS for {pid}"))
}

/// The service's RSS once it has been left alone for [`SETTLE_MS`]: the median of five
/// readings 200 ms apart.
fn settled_rss(pid: u32) -> Result<u64, String> {
    std::thread::sleep(Duration::from_millis(SETTLE_MS));
    let mut readings = Vec::new();
    for _ in 0..5 {
        readings.push(rss(pid)?);
        std::thread::sleep(Duration::from_millis(200));
    }
    readings.sort_unstable();
    Ok(readings[2])
}
