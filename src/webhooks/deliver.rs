//! The deliverer: claims a batch of due deliveries under a lease, POSTs each as a Standard
//! Webhook (the batch's at once, on one client that keeps its connections alive), then
//! records the batch's outcomes in one statement. Every endpoint goes this one way,
//! CHECKOUT_WEBHOOK_URL's as the others. No transaction is open while a delivery is
//! sent; a delivery whose deliverer died mid-send is claimed again by any instance once
//! its lease lapses, and sent again with the same `webhook-id` (the endpoint deduplicates
//! by it: delivery is at least once).
//!
//! 2xx is delivered. 410 Gone disables the endpoint (every instance stops sending to it:
//! the claim takes only enabled endpoints' deliveries). Anything else (a 3xx too: no
//! redirect is followed; a timeout; no connection) is tried again after the next wait of
//! the retry schedule, or after `Retry-After` on 429 and 503; after the schedule's last
//! wait the delivery is recorded failed.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use reqwest::header::{CONTENT_TYPE, HeaderMap, LOCATION, RETRY_AFTER};

use super::endpoints::{self, Subscribed};
use super::sign::SigningKeys;
use super::store::{BATCH, Claimed, Deliveries, Outcome};
use super::{Wanted, WebhookSettings};
use crate::db::Database;
use crate::metrics::Metrics;
use crate::secret::Secret;
use crate::worker::Worker;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// How often the endpoints (the types written) and the backlog are read.
const SURVEY: Duration = Duration::from_secs(1);

/// What one attempt came to.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Delivered,
    /// 410: the endpoint is gone.
    Gone,
    /// Worth trying again: after `after` when the endpoint said so.
    Again {
        error: String,
        after: Option<Duration>,
    },
}

/// An endpoint as a request is made to it: its URL and keys, read from its row once (and
/// again when the row changes).
struct Target {
    url: String,
    secret: String,
    parsed: Result<(reqwest::Url, SigningKeys), String>,
}

impl Target {
    fn of(row: &Claimed) -> Target {
        let parsed = reqwest::Url::parse(&row.url)
            .map_err(|e| format!("the endpoint's URL {:?}: {e}", row.url))
            .and_then(|url| {
                SigningKeys::parse(&Secret::new(row.secret.as_str()))
                    .map(|keys| (url, keys))
                    .map_err(|e| format!("the endpoint's stored secret {e}"))
            });
        Target {
            url: row.url.clone(),
            secret: row.secret.clone(),
            parsed,
        }
    }
}

/// Sends the events to every endpoint, CHECKOUT_WEBHOOK_URL's and those of `checkout
/// webhooks add`, for as long as the service runs.
pub struct Deliverer {
    db: Database,
    /// Whether CHECKOUT_WEBHOOK_URL's endpoint is written as the settings say
    /// (`endpoints::configure`): done at start-up, else first thing here.
    configured: bool,
    deliveries: Deliveries,
    /// The types the stores write: every endpoint's.
    subscribed: Subscribed,
    /// How many endpoints there were at the last survey: with none, nothing is claimed.
    endpoints: usize,
    sender: Sender,
}

/// What sends an attempt and judges its answer: apart from the deliveries' store, so that
/// a batch's outcomes are recorded while the rest of its attempts are still out.
struct Sender {
    http: reqwest::Client,
    targets: HashMap<String, Target>,
    settings: WebhookSettings,
    metrics: Metrics,
}

impl Deliverer {
    /// The deliverer of the database's endpoints, keeping `subscribed` up to date;
    /// `configured` once CHECKOUT_WEBHOOK_URL's is written (`endpoints::configure`).
    pub fn new(
        db: &Database,
        settings: &WebhookSettings,
        subscribed: &Subscribed,
        metrics: &Metrics,
        configured: bool,
    ) -> Result<Deliverer, String> {
        // reqwest is built without a crypto provider of its own (as the Stripe client):
        // without this, building the client panics where it wants TLS (HTTPS_PROXY set).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(settings.timeout)
            .build()
            .map_err(|e| format!("the webhook client: {e}"))?;
        Ok(Deliverer {
            db: db.clone(),
            configured,
            deliveries: Deliveries::new(db),
            subscribed: subscribed.clone(),
            endpoints: usize::from(!subscribed.now().is_empty()),
            sender: Sender {
                http,
                targets: HashMap::new(),
                settings: settings.clone(),
                metrics: metrics.clone(),
            },
        })
    }

    async fn deliver_for_ever(mut self) {
        let first = self.sender.settings.retry_schedule.first().copied();
        let poll = first
            .unwrap_or(Duration::from_secs(1))
            .clamp(Duration::from_millis(20), Duration::from_secs(1));
        let lease_ms = millis(self.sender.settings.lease);
        let mut surveyed: Option<Instant> = None;
        loop {
            // Between surveys (a retry schedule shorter than a second polls more often),
            // and after a full batch, a claim is made; at a survey, only if one is due.
            let mut due = true;
            if surveyed.is_none_or(|at| at.elapsed() >= SURVEY) {
                surveyed = Some(Instant::now());
                if !self.configured {
                    self.configured = Box::pin(endpoints::configure(&self.db, &self.sender.settings))
                        .await
                        .inspect_err(|err| tracing::warn!(error = %err, "webhooks: cannot write CHECKOUT_WEBHOOK_URL among the endpoints; trying again"))
                        .is_ok();
                }
                due = Box::pin(self.survey()).await;
            }
            let mut claimed = Vec::new();
            if self.endpoints > 0 && due {
                claimed = Box::pin(self.deliveries.claim(lease_ms))
                    .await
                    .unwrap_or_else(|err| {
                        tracing::warn!(error = %err, "webhooks: cannot claim deliveries; trying again");
                        Vec::new()
                    });
            }
            let full = claimed.len() == BATCH;
            if !claimed.is_empty() {
                Box::pin(self.deliver(claimed)).await;
            }
            if !full {
                tokio::time::sleep(poll).await;
            }
        }
    }

    /// The endpoints' types, written from now on, and the backlog's metrics; whether a
    /// delivery is due (yes when the survey failed: the claim says).
    async fn survey(&mut self) -> bool {
        match self.deliveries.survey().await {
            Ok(survey) => {
                self.endpoints = survey.events.len();
                let wanted = survey
                    .events
                    .iter()
                    .filter_map(|text| WebhookSettings::parse_events(text).ok())
                    .fold(Wanted::none(), Wanted::and);
                self.subscribed.set(wanted);
                self.sender
                    .metrics
                    .webhook_backlog(survey.backlog.pending, survey.backlog.oldest_age_ms);
                survey.due > 0
            }
            Err(err) => {
                tracing::warn!(error = %err, "webhooks: cannot read the endpoints; trying again");
                true
            }
        }
    }

    /// One attempt of each of `claimed`, at once; their outcomes recorded as they come, those
    /// that came together in one statement (all of them, when the endpoints answer
    /// alike): one slow endpoint does not hold the record of the others' deliveries, which
    /// an instance that died before it would leave to be sent again.
    async fn deliver(&mut self, mut claimed: Vec<Claimed>) {
        self.sender.know(&claimed);
        let bodies: Vec<String> = claimed
            .iter_mut()
            .map(|row| std::mem::take(&mut row.body))
            .collect();
        let (sender, deliveries) = (&self.sender, &mut self.deliveries);
        let mut answered = claimed
            .iter()
            .zip(bodies)
            .map(|(row, body)| async move { (row, sender.send(row, body).await) })
            .collect::<FuturesUnordered<_>>()
            .ready_chunks(BATCH);
        while let Some(chunk) = answered.next().await {
            let mut gone: Vec<(&str, &str)> = Vec::new();
            let outcomes: Vec<(&Claimed, Outcome)> = chunk
                .into_iter()
                .map(|(row, attempt)| (row, sender.outcome(row, attempt, &mut gone)))
                .collect();
            if let Err(err) = Box::pin(deliveries.record(&outcomes, &gone)).await {
                // The leases lapse and the deliveries are claimed again: at worst a second
                // delivery with the same webhook-id.
                tracing::warn!(error = %err, deliveries = outcomes.len(), "webhooks: cannot record the deliveries' outcomes");
            }
        }
    }
}

impl Sender {
    /// Each endpoint of `claimed` as its row reads now: its URL and keys parsed once.
    fn know(&mut self, claimed: &[Claimed]) {
        for row in claimed {
            let current = self
                .targets
                .get(&row.subscription)
                .is_some_and(|t| t.url == row.url && t.secret == row.secret);
            if !current {
                self.targets
                    .insert(row.subscription.clone(), Target::of(row));
            }
        }
    }

    /// What `attempt` of `row` comes to, logged and counted; an endpoint that answered 410
    /// is added to `gone`.
    fn outcome<'r>(
        &self,
        row: &'r Claimed,
        attempt: Attempt,
        gone: &mut Vec<(&'r str, &'static str)>,
    ) -> Outcome {
        let (event, endpoint) = (&row.event_id, row.subscription.as_str());
        match self.verdict(attempt, row.attempts) {
            Verdict::Delivered => {
                tracing::debug!(%event, %endpoint, attempt = row.attempts, "webhooks: event delivered");
                Outcome::Delivered
            }
            Verdict::Gone => {
                tracing::error!(%event, %endpoint, url = %row.url, "webhooks: the endpoint answered 410 Gone; it is disabled, nothing more is sent to it (its events are kept for it: docs/webhooks.md)");
                if !gone.iter().any(|(id, _)| *id == endpoint) {
                    gone.push((endpoint, "410 Gone"));
                }
                // The claim given back: the delivery stays pending, for the endpoint
                // enabled again.
                Outcome::Later {
                    error: "410 Gone".into(),
                    delay_ms: 0,
                }
            }
            Verdict::Failed(error) => {
                tracing::error!(%event, %endpoint, attempts = row.attempts, %error, "webhooks: out of retries; the delivery is recorded failed");
                Outcome::Failed { error }
            }
            Verdict::Later(error, delay_ms) => {
                tracing::warn!(%event, %endpoint, attempt = row.attempts, %error, retry_in_ms = delay_ms, "webhooks: not delivered; trying again later");
                Outcome::Later { error, delay_ms }
            }
        }
    }

    /// What `attempt`, the `attempts`-th, comes to, counted in the metrics.
    fn verdict(&self, attempt: Attempt, attempts: i64) -> Verdict {
        let schedule = &self.settings.retry_schedule;
        let retries_done = usize::try_from(attempts.saturating_sub(1)).unwrap_or(0);
        match attempt {
            Attempt::Delivered => {
                self.metrics.webhook_delivery("delivered");
                Verdict::Delivered
            }
            Attempt::Gone => {
                self.metrics.webhook_delivery("gone");
                Verdict::Gone
            }
            Attempt::Again { error, .. } if retries_done >= schedule.len() => {
                self.metrics.webhook_delivery("failed");
                Verdict::Failed(error)
            }
            Attempt::Again { error, after } => {
                self.metrics.webhook_delivery("retried");
                // Retry-After lengthens the schedule's wait, never shortens it; a day at most.
                let step = schedule[retries_done];
                let wait = after.map_or(step, |after| after.min(DAY).max(step));
                Verdict::Later(error, millis(wait))
            }
        }
    }

    /// One attempt of `row`, whose body is `body`.
    async fn send(&self, row: &Claimed, body: String) -> Attempt {
        let (url, keys) = match self.targets.get(&row.subscription).map(|t| &t.parsed) {
            Some(Ok((url, keys))) => (url, keys),
            Some(Err(error)) => {
                return Attempt::Again {
                    error: error.clone(),
                    after: None,
                };
            }
            None => unreachable!("every claimed delivery's target is made before it is sent"),
        };
        let timestamp = chrono::Utc::now().timestamp();
        let sent = self
            .http
            .post(url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", &row.event_id)
            .header("webhook-timestamp", timestamp)
            .header(
                "webhook-signature",
                keys.sign(&row.event_id, timestamp, &body),
            )
            .body(body)
            .send()
            .await;
        match sent {
            Ok(answer) => outcome(answer.status().as_u16(), answer.headers()),
            Err(err) if err.is_timeout() => Attempt::Again {
                error: format!("no answer within {} ms", self.settings.timeout.as_millis()),
                after: None,
            },
            Err(err) => Attempt::Again {
                error: format!("cannot reach the endpoint: {err}"),
                after: None,
            },
        }
    }
}

/// What a delivery comes to after an attempt, by the retry schedule.
enum Verdict {
    Delivered,
    Gone,
    Failed(String),
    Later(String, i64),
}

/// What an answer with `status` and `headers` means for the event.
fn outcome(status: u16, headers: &HeaderMap) -> Attempt {
    match status {
        200..=299 => Attempt::Delivered,
        410 => Attempt::Gone,
        300..=399 => Attempt::Again {
            error: format!(
                "{status} to {:?}: redirects are not followed",
                headers
                    .get(LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .unwrap_or_default()
            ),
            after: None,
        },
        429 | 503 => Attempt::Again {
            error: format!("{status}"),
            after: retry_after(headers),
        },
        _ => Attempt::Again {
            error: format!("{status}"),
            after: None,
        },
    }
}

/// `Retry-After` as delay-seconds or an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(
        date.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Worker for Deliverer {
    const NAME: &'static str = "webhook deliverer";

    /// Claims and sends due deliveries; polls when none is due (events are written by
    /// every instance's stores, and retries fall due by the clock). Reads the endpoints
    /// and the backlog every second.
    async fn run(self) {
        self.deliver_for_ever().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_status_means_what_standard_webhooks_says() {
        let none = HeaderMap::new();
        assert_eq!(outcome(204, &none), Attempt::Delivered);
        assert_eq!(outcome(410, &none), Attempt::Gone);
        let mut later = HeaderMap::new();
        later.insert(RETRY_AFTER, "7".parse().unwrap());
        for status in [429, 503] {
            assert_eq!(
                outcome(status, &later),
                Attempt::Again {
                    error: status.to_string(),
                    after: Some(Duration::from_secs(7))
                }
            );
        }
        // Retry-After is the endpoint's word only on 429 and 503.
        assert_eq!(
            outcome(500, &later),
            Attempt::Again {
                error: "500".into(),
                after: None
            }
        );
        let mut moved = HeaderMap::new();
        moved.insert(LOCATION, "https://elsewhere.example/".parse().unwrap());
        assert!(
            matches!(outcome(301, &moved), Attempt::Again { error, .. } if error.contains("elsewhere"))
        );
    }
}
