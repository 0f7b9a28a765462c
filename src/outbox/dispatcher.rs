//! The dispatcher: claims due outbox rows with a lease, sends each message, then records
//! the outcome. No transaction is open while a message is sent; a row whose dispatcher
//! died mid-send is claimed again once its lease lapses, and sent again with the same
//! Message-ID (SMTP cannot tell us whether a server that never acknowledged took it).
//!
//! With `CHECKOUT_SMTP_URL`, messages go to that server (lettre, pooled connections,
//! rustls for `smtps://` and STARTTLS). Without it, each message is written whole as
//! `<message-id>.eml` in `CHECKOUT_MAIL_DIR`, so the embedded default shows the flow.

use std::path::PathBuf;
use std::time::Duration;

use lettre::address::Envelope;
use lettre::message::Mailbox;
use lettre::transport::smtp::PoolConfig;
use lettre::{Address, AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use super::{Claimed, Outbox};
use crate::metrics::{EmailOutcome, Metrics};
use crate::secret::Secret;
use crate::worker::Worker;

/// How confirmation emails leave the service.
#[derive(Clone, Debug)]
pub struct MailSettings {
    /// `CHECKOUT_SMTP_URL`: `smtp://` or `smtps://`, credentials and all; none writes
    /// `.eml` files.
    pub smtp_url: Option<Secret>,
    /// `CHECKOUT_MAIL_DIR`: where `.eml` files go without an SMTP server.
    pub dir: PathBuf,
    /// `CHECKOUT_MAIL_FROM`: the sender, and the domain of every Message-ID.
    pub from: Mailbox,
    /// How long a dispatcher holds a claimed row; another instance's dispatcher takes it
    /// after that. Longer than one SMTP exchange may take.
    pub lease: Duration,
    /// Delivery attempts before a message that keeps failing transiently is recorded failed.
    pub max_attempts: u32,
    /// Backoff between attempts: doubling from `backoff_min` up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl MailSettings {
    /// Whether `url` is an SMTP URL the transport takes (checked at start-up).
    pub fn check_url(url: &str) -> Result<(), String> {
        if !(url.starts_with("smtp://") || url.starts_with("smtps://")) {
            return Err("must start with smtp:// or smtps://".into());
        }
        AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            .map(drop)
            .map_err(|err| format!("not an SMTP URL the mailer takes: {err}"))
    }

    /// The SMTP server's URL without its credentials, for the log.
    pub fn shown_url(&self) -> Option<String> {
        let url = self.smtp_url.as_ref()?.expose();
        let (scheme, rest) = url.split_once("://").unwrap_or(("smtp", url));
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        Some(format!("{scheme}://{host}"))
    }
}

/// Where messages go.
#[derive(Clone)]
pub enum MailTransport {
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    Files(PathBuf),
}

impl MailTransport {
    /// The transport the settings name; the mail directory is made if missing.
    pub fn new(settings: &MailSettings) -> Result<MailTransport, String> {
        match &settings.smtp_url {
            Some(url) => {
                let smtp = AsyncSmtpTransport::<Tokio1Executor>::from_url(url.expose())
                    .map_err(|err| format!("CHECKOUT_SMTP_URL: {err}"))?
                    // One SMTP command may take up to half the claim's lease.
                    .timeout(Some(settings.lease / 2))
                    .pool_config(PoolConfig::new().max_size(4))
                    .build();
                Ok(MailTransport::Smtp(smtp))
            }
            None => {
                std::fs::create_dir_all(&settings.dir).map_err(|err| {
                    format!(
                        "CHECKOUT_MAIL_DIR: cannot make {}: {err}",
                        settings.dir.display()
                    )
                })?;
                let dir = std::fs::canonicalize(&settings.dir).unwrap_or(settings.dir.clone());
                Ok(MailTransport::Files(dir))
            }
        }
    }
}

/// What one delivery attempt came to.
enum Attempt {
    Delivered,
    /// Worth trying again: a 4xx, a broken or refused connection, a timeout.
    Transient(String),
    /// A 5xx: the server will not take it.
    Permanent(String),
}

/// Empties the outbox, for as long as the service runs.
pub struct Dispatcher {
    outbox: Outbox,
    transport: MailTransport,
    settings: MailSettings,
    metrics: Metrics,
}

impl Dispatcher {
    pub fn new(
        outbox: Outbox,
        transport: MailTransport,
        settings: MailSettings,
        metrics: Metrics,
    ) -> Self {
        Dispatcher {
            outbox,
            transport,
            settings,
            metrics,
        }
    }

    async fn deliver_for_ever(self) {
        let poll = self
            .settings
            .backoff_min
            .clamp(Duration::from_millis(20), Duration::from_secs(1));
        let lease_ms = i64::try_from(self.settings.lease.as_millis()).unwrap_or(i64::MAX);
        loop {
            let claimed = match self.outbox.claim(lease_ms).await {
                Ok(claimed) => claimed,
                Err(err) => {
                    tracing::warn!(error = %err, "outbox: cannot claim messages; trying again");
                    Vec::new()
                }
            };
            if claimed.is_empty() {
                tokio::select! {
                    () = self.outbox.written() => {}
                    () = tokio::time::sleep(poll) => {}
                }
                continue;
            }
            for row in claimed {
                self.deliver(row).await;
            }
        }
    }

    async fn deliver(&self, row: Claimed) {
        let attempt = self.send(&row).await;
        let recorded = match attempt {
            Attempt::Delivered => {
                self.metrics.email(EmailOutcome::Sent);
                tracing::info!(message_id = %row.message_id, attempt = row.attempts, "outbox: message delivered");
                self.outbox.sent(&row).await
            }
            Attempt::Permanent(error) => {
                self.metrics.email(EmailOutcome::Failed);
                tracing::error!(message_id = %row.message_id, attempt = row.attempts, %error, "outbox: the mail server refused the message permanently; it is recorded failed and not sent again");
                self.outbox.failed(&row, &error).await
            }
            Attempt::Transient(error) if row.attempts >= i64::from(self.settings.max_attempts) => {
                self.metrics.email(EmailOutcome::Failed);
                tracing::error!(message_id = %row.message_id, attempts = row.attempts, %error, "outbox: out of delivery attempts; the message is recorded failed");
                self.outbox.failed(&row, &error).await
            }
            Attempt::Transient(error) => {
                self.metrics.email(EmailOutcome::Retried);
                let delay = self.backoff(row.attempts);
                tracing::warn!(message_id = %row.message_id, attempt = row.attempts, %error, retry_in_ms = delay, "outbox: delivery failed transiently; trying again later");
                self.outbox.retry_later(&row, &error, delay).await
            }
        };
        if let Err(err) = recorded {
            // The claim lapses and the row is claimed again: at worst a second delivery
            // with the same Message-ID.
            tracing::warn!(message_id = %row.message_id, error = %err, "outbox: cannot record a delivery's outcome");
        }
    }

    fn backoff(&self, attempts: i64) -> i64 {
        let doublings = u32::try_from(attempts.saturating_sub(1))
            .unwrap_or(0)
            .min(20);
        let delay = self
            .settings
            .backoff_min
            .saturating_mul(1 << doublings)
            .min(self.settings.backoff_max);
        i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)
    }

    async fn send(&self, row: &Claimed) -> Attempt {
        match &self.transport {
            MailTransport::Files(dir) => {
                let name = row.message_id.trim_matches(['<', '>']);
                let path = dir.join(format!("{name}.eml"));
                let partial = dir.join(format!(".{name}.eml.partial"));
                let written = tokio::fs::write(&partial, &row.message).await;
                match written.and(tokio::fs::rename(&partial, &path).await) {
                    Ok(()) => {
                        tracing::info!(file = %path.display(), "outbox: message written as a file (no CHECKOUT_SMTP_URL)");
                        Attempt::Delivered
                    }
                    Err(err) => {
                        Attempt::Transient(format!("cannot write {}: {err}", path.display()))
                    }
                }
            }
            MailTransport::Smtp(smtp) => {
                let envelope = match envelope(row) {
                    Ok(envelope) => envelope,
                    Err(err) => return Attempt::Permanent(err),
                };
                match smtp.send_raw(&envelope, &row.message).await {
                    Ok(_) => Attempt::Delivered,
                    Err(err) if err.is_permanent() => Attempt::Permanent(err.to_string()),
                    Err(err) => Attempt::Transient(err.to_string()),
                }
            }
        }
    }
}

impl Worker for Dispatcher {
    const NAME: &'static str = "outbox dispatcher";

    /// Claims and sends due rows; waits for a new row or the next retry's time when none
    /// is due. Rows of other instances (and of a crashed one) are found by the polling.
    async fn run(self) {
        self.deliver_for_ever().await
    }
}

fn envelope(row: &Claimed) -> Result<Envelope, String> {
    let address = |text: &str| {
        text.parse::<Address>()
            .map_err(|err| format!("the outbox row's address {text:?}: {err}"))
    };
    Envelope::new(Some(address(&row.sender)?), vec![address(&row.recipient)?])
        .map_err(|err| err.to_string())
}
