//! Figure 7: instructions and heap allocations per checkout, counted by valgrind: figures
//! that do not move with the machine's load, where CPU time on a shared 2-core machine
//! swings by 20 % between runs.
//!
//! The service runs under callgrind (instructions executed) or dhat (heap blocks
//! allocated); the scripted model is a process of its own, so only the service is
//! counted. Checkouts go one at a time over one keep-alive connection. Instructions: a
//! few checkouts warm the service up, callgrind's counters are zeroed
//! (`callgrind_control -z`), many more are sent and the counters dumped: the window's
//! total over its checkouts. (Two runs from a fresh start, differenced, were thrown off by
//! start-up work that varies with wall time under valgrind: a run of 25 once counted
//! fewer instructions than a run of 5.) Heap blocks: dhat cannot zero, so one run sends
//! a few checkouts, another many, and the difference of the totals over the difference
//! in checkouts is the cost of one. Keyless and keyed (an Idempotency-Key: the record,
//! its lease and the saved answer), on each database.
//!
//! `--webhooks`: each count without an endpoint, then with one configured (every event
//! type on, a consumer here answering 204): each checkout's `charge.succeeded` is written
//! with its receipt and delivered by the service's deliverer. The warm-up's events are
//! delivered before the counters are zeroed, and the window's before they are dumped
//! (dhat: before the service stops), so a window counts its own checkouts' deliveries, no
//! others. Then, instructions only, with the consumer answering 410 Gone: the endpoint is
//! disabled by the warm-up's first event, and the window's events are written (kept for
//! it) and never sent: the checkout with its event's write, without the delivery. And the
//! floor of one delivery: `floor-webhook`'s signed POSTs by a bare reqwest client, under
//! callgrind (a run of a few and one of many, differenced).

use std::sync::atomic::AtomicU64;

use super::*;

/// `whsec_` + base64 of 32 bytes: the bench's endpoint's secret.
const SECRET: &str = "whsec_AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";

/// What the service is told of webhooks in a count.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hooks {
    /// No endpoint.
    Off,
    /// An endpoint whose consumer answers 204: every event delivered.
    Delivered,
    /// An endpoint whose consumer answers 410 Gone: disabled by the warm-up's first event,
    /// nothing sent in the window.
    Gone,
}

impl Hooks {
    fn label(self) -> &'static str {
        match self {
            Hooks::Off => "",
            Hooks::Delivered => ", webhooks configured",
            Hooks::Gone => ", webhooks configured, endpoint gone (nothing sent)",
        }
    }
}

/// A webhook endpoint answering `status` to every request, counting them.
struct Consumer {
    url: String,
    received: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Consumer {
    fn start(rt: &tokio::runtime::Runtime, status: u16) -> Result<Consumer, String> {
        let status = axum::http::StatusCode::from_u16(status).map_err(|e| e.to_string())?;
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| format!("the webhook consumer: {e}"))?;
            let addr = listener.local_addr().map_err(|e| e.to_string())?;
            let received = Arc::new(AtomicU64::new(0));
            let count = received.clone();
            let app = axum::Router::new().fallback(move || {
                count.fetch_add(1, Ordering::SeqCst);
                async move { status }
            });
            let task = tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            Ok(Consumer {
                url: format!("http://{addr}/hooks"),
                received,
                task,
            })
        })
    }

    /// Waits until `n` events have come (a minute at most).
    fn until(&self, rt: &tokio::runtime::Runtime, n: u32) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.received.load(Ordering::SeqCst) < u64::from(n) {
            if Instant::now() > deadline {
                return Err(format!(
                    "{} of {n} webhook events delivered after a minute",
                    self.received.load(Ordering::SeqCst)
                ));
            }
            rt.block_on(async { tokio::time::sleep(Duration::from_millis(10)).await });
        }
        Ok(())
    }
}

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
    /// The service under `tool`, `checkouts` sent to it: the tool's total; under
    /// callgrind, the total of the checkouts after the first `warm` only.
    fn counted(
        &self,
        db: &Db,
        (tool, hooks): (Tool, Hooks),
        keyed: bool,
        (warm, checkouts): (u32, u32),
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
        let consumer = match hooks {
            Hooks::Off => None,
            Hooks::Delivered => Some(Consumer::start(&self.rt, 204)?),
            Hooks::Gone => Some(Consumer::start(&self.rt, 410)?),
        };
        if let Some(consumer) = &consumer {
            command
                .env("CHECKOUT_WEBHOOK_URL", &consumer.url)
                .env("CHECKOUT_WEBHOOK_SECRET", SECRET)
                .env("CHECKOUT_WEBHOOK_EVENTS", "all");
        }
        // Each checkout's events delivered, when an endpoint is configured. Gone: after the
        // warm-up, the first event's 410 recorded (the endpoint disabled); then nothing.
        let delivered = |n: u32| match (&consumer, hooks) {
            (Some(consumer), Hooks::Delivered) => consumer.until(&self.rt, n),
            (Some(consumer), Hooks::Gone) if n == warm && warm > 0 => {
                consumer.until(&self.rt, 1).map(|()| {
                    self.rt
                        .block_on(async { tokio::time::sleep(Duration::from_secs(2)).await })
                })
            }
            _ => Ok(()),
        };
        let name = format!("service-{tag}");
        let service = child::start(&self.env, &name, command, "listening on http://")?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let control = |what: &str| -> Result<(), String> {
            let status = std::process::Command::new("callgrind_control")
                .args([what, &service.pid_str()])
                .stdout(std::process::Stdio::null())
                .status()
                .map_err(|e| format!("callgrind_control: {e}"))?;
            match status.success() {
                true => Ok(()),
                false => Err(format!("callgrind_control {what} failed: {status}")),
            }
        };
        let http = reqwest::Client::builder()
            .http1_only()
            .build()
            .map_err(|e| e.to_string())?;
        let send = |range: std::ops::Range<u32>| {
            self.rt.block_on(async {
                for i in range {
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
                Ok::<(), String>(())
            })
        };
        let sent = match tool {
            Tool::Callgrind => send(0..warm)
                .and_then(|()| delivered(warm))
                .and_then(|()| control("-z"))
                .and_then(|()| send(warm..checkouts))
                .and_then(|()| delivered(checkouts))
                .and_then(|()| control("-d")),
            Tool::Dhat => send(0..checkouts).and_then(|()| delivered(checkouts)),
        };
        if let Some(consumer) = consumer {
            consumer.task.abort();
        }
        let log = service.log.clone();
        service.stop_within(Duration::from_secs(120));
        model.stop();
        sent?;
        match tool {
            // The dump of the window, beside the file written at exit.
            Tool::Callgrind => {
                let dump = PathBuf::from(format!("{}.1", out.display()));
                let text = std::fs::read_to_string(&dump)
                    .map_err(|e| format!("{}: {e}", dump.display()))?;
                text.lines()
                    .find_map(|l| l.strip_prefix("totals: ").or(l.strip_prefix("summary: ")))
                    .and_then(|n| n.trim().parse().ok())
                    .ok_or_else(|| format!("no totals in {}", dump.display()))
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

    /// Figure 7: instructions and heap blocks per checkout, keyless and keyed; with
    /// `--webhooks`, each without an endpoint, with one, and with one gone, then the floor
    /// of one delivery.
    pub(super) fn counts(&mut self, db: &Db) -> Result<(), String> {
        let (few, many) = if self.plan.quick { (5, 25) } else { (10, 110) };
        let modes: &[Hooks] = match self.plan.webhooks {
            true => &[Hooks::Off, Hooks::Delivered, Hooks::Gone],
            false => &[Hooks::Off],
        };
        for keyed in [false, true] {
            let kind = if keyed { "keyed" } else { "keyless" };
            for &hooks in modes {
                for (tool, what, unit) in [
                    (Tool::Callgrind, "instructions", "instructions"),
                    (Tool::Dhat, "heap allocations", "blocks"),
                ] {
                    if matches!((tool, hooks), (Tool::Dhat, Hooks::Gone)) {
                        continue;
                    }
                    let mode = match hooks {
                        Hooks::Off => "",
                        Hooks::Delivered => "hooks",
                        Hooks::Gone => "gone",
                    };
                    let tag = |n: u32| format!("n{}{}{kind}{mode}{n}", tool.name(), db.name);
                    let counted = |n: (u32, u32)| -> Result<u64, String> {
                        self.counted(db, (tool, hooks), keyed, n, &tag(n.1))
                    };
                    let (per, how) = match tool {
                        Tool::Callgrind => {
                            let window = counted((few, many))?;
                            let per = window as f64 / f64::from(many - few);
                            (
                                per,
                                format!(
                                    "{window} for checkouts {} to {many}, after {few} to warm up",
                                    few + 1
                                ),
                            )
                        }
                        Tool::Dhat => {
                            let small = counted((0, few))?;
                            let large = counted((0, many))?;
                            let per = large.saturating_sub(small) as f64 / f64::from(many - few);
                            (
                                per,
                                format!("{small} for {few} checkouts, {large} for {many}"),
                            )
                        }
                    };
                    let label = format!("{kind}{}", hooks.label());
                    self.note(&format!(
                        "{what} per checkout, {label}, {}: {per:.0} ({how})",
                        db.name
                    ));
                    self.metrics.push(Metric::new(
                        7,
                        &format!("{what} per checkout, {label}"),
                        db.name,
                        unit,
                        vec![per],
                    ));
                }
            }
        }
        if self.plan.webhooks {
            let per = self.webhook_floor((few, many))?;
            self.note(&format!(
                "instructions per signed webhook POST, bare reqwest (floor-webhook), {}: {per:.0}",
                db.name
            ));
            self.metrics.push(Metric::new(
                7,
                "instructions per signed webhook POST, bare reqwest (floor)",
                db.name,
                "instructions",
                vec![per],
            ));
        }
        Ok(())
    }

    /// Instructions of one signed webhook POST by a bare reqwest client (`floor-webhook`),
    /// to a consumer here answering 204: a run of `few` and one of `many` under callgrind,
    /// differenced.
    fn webhook_floor(&self, (few, many): (u32, u32)) -> Result<f64, String> {
        let consumer = Consumer::start(&self.rt, 204)?;
        let me = std::env::current_exe().map_err(|e| e.to_string())?;
        let run = |n: u32| -> Result<u64, String> {
            let out = self.env.work.join(format!("floor-webhook-{n}.callgrind"));
            let status = std::process::Command::new("valgrind")
                .arg("--tool=callgrind")
                .arg(format!("--callgrind-out-file={}", out.display()))
                .arg(&me)
                .args(["floor-webhook", "--url", &consumer.url, "--requests"])
                .arg(n.to_string())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .map_err(|e| format!("valgrind: {e}"))?;
            if !status.success() {
                return Err(format!("floor-webhook under callgrind failed: {status}"));
            }
            let text =
                std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            text.lines()
                .find_map(|l| l.strip_prefix("totals: ").or(l.strip_prefix("summary: ")))
                .and_then(|n| n.trim().parse().ok())
                .ok_or_else(|| format!("no totals in {}", out.display()))
        };
        let (small, large) = (run(few)?, run(many)?);
        consumer.task.abort();
        Ok(large.saturating_sub(small) as f64 / f64::from(many - few))
    }
}
