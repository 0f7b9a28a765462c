//! Real SMTP servers for the confirmation-email tests, as processes: maildev (npm,
//! `maildev@3.0.0`) for the happy path, read back through its `GET /api/email`, and
//! `tests/smtp/faulty_smtp.py` (aiosmtpd) for the faults maildev cannot make. Both are
//! installed into `target/tools` by `scripts/test`, which exports their paths.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) fn tool(env: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(default));
    assert!(
        path.exists(),
        "{} is missing: scripts/test installs it (or set {env})",
        path.display()
    );
    path
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A server process given `N` free ports: `command` makes it for the ports, `ready` asks
/// it whether it serves. Such a server cannot be given port 0, so between [`free_port`]
/// and its `listen` another test's process may take a port; the server then exits
/// ("address already in use") and is started again on other ports, up to 5 times. Any
/// other exit, or no readiness within 15 s, fails with what the process printed.
pub(crate) async fn on_free_ports<const N: usize>(
    what: &str,
    command: impl Fn([u16; N]) -> Command,
    mut ready: impl AsyncFnMut([u16; N]) -> bool,
) -> (Child, [u16; N]) {
    for _ in 0..5 {
        let ports = std::array::from_fn(|_| free_port());
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let mut child = command(ports)
            .stdout(log.reopen().expect("a log file"))
            .stderr(log.reopen().expect("a log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        let output = || std::fs::read_to_string(log.path()).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            // A port taken by another process may hold the question unanswered.
            let answered = tokio::time::timeout(Duration::from_secs(1), ready(ports)).await;
            if answered == Ok(true) {
                return (child, ports);
            }
            if let Some(status) = child.try_wait().expect("the process's status") {
                let output = output();
                assert!(
                    output.to_lowercase().contains("address already in use"),
                    "{what} exited ({status}): {output}"
                );
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("{what} did not answer within 15 s: {}", output());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    panic!("{what} found a port taken at 5 starts");
}

/// A maildev process: SMTP on one port, its API on another.
pub struct Maildev {
    child: Child,
    pub smtp_port: u16,
    api: String,
}

impl Maildev {
    pub async fn start() -> Maildev {
        let maildev = tool(
            "CHECKOUT_TEST_MAILDEV",
            "target/tools/maildev/node_modules/.bin/maildev",
        );
        let api = |web: u16| format!("http://127.0.0.1:{web}/api/email");
        let http = super::client();
        let (child, [smtp_port, web_port]) = on_free_ports(
            "maildev",
            |[smtp, web]| {
                let mut command = Command::new(&maildev);
                command
                    .args(["--ip", "127.0.0.1", "--web-ip", "127.0.0.1"])
                    .args(["--smtp", &smtp.to_string(), "--web", &web.to_string()]);
                command
            },
            // Its SMTP server listens before its API: an answer means both are up.
            async |[_, web]| {
                let answer = http.get(api(web)).send().await;
                answer.is_ok_and(|r| r.status().is_success())
            },
        )
        .await;
        Maildev {
            child,
            smtp_port,
            api: api(web_port),
        }
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.smtp_port)
    }

    /// Every message maildev received, as its API gives them.
    pub async fn messages(&self) -> Vec<Value> {
        let reply = super::client()
            .get(&self.api)
            .send()
            .await
            .expect("GET /api/email");
        reply
            .json::<Vec<Value>>()
            .await
            .expect("a list of messages")
    }
}

impl Drop for Maildev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The faulty server: what it did with each message it was given, logged to a file.
pub struct FaultySmtp {
    child: Child,
    pub port: u16,
    log: tempfile::NamedTempFile,
}

impl FaultySmtp {
    /// `args`: `--drop N`, `--tempfail N`, `--permfail`, `--hold N` (see the script).
    pub fn start(args: &[&str]) -> FaultySmtp {
        let python = tool(
            "CHECKOUT_TEST_SMTP_PYTHON",
            "target/tools/smtp-venv/bin/python",
        );
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let mut child = Command::new(python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/smtp/faulty_smtp.py"
            ))
            .arg("--log")
            .arg(log.path())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the faulty SMTP server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("its first line");
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the faulty SMTP server said {line:?}"));
        FaultySmtp { child, port, log }
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// One entry per message it was given: `message_id`, `outcome` (accepted, dropped,
    /// tempfail, permfail, held), `from`, `to`.
    pub fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(self.log.path())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    /// The outcomes, in order.
    pub fn outcomes(&self) -> Vec<String> {
        self.received()
            .iter()
            .map(|m| m["outcome"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

impl Drop for FaultySmtp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
