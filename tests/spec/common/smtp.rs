//! Real SMTP servers for the confirmation-email tests, as processes: maildev (npm,
//! `maildev@3.0.0`) for the happy path, read back through its `GET /api/email`, and
//! `tests/smtp/faulty_smtp.py` (aiosmtpd) for the faults maildev cannot make. Both are
//! installed into `target/tools` by `scripts/test`, which exports their paths.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::servers::{on_free_ports, tool};

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
