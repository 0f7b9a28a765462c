//! The deliverer: claims due events under a lease, POSTs each as a Standard Webhook, then
//! records the outcome. No transaction is open while an event is sent; an event whose
//! deliverer died mid-send is claimed again by any instance once its lease lapses, and
//! sent again with the same `webhook-id` (the endpoint deduplicates by it: delivery is at
//! least once).
//!
//! 2xx is delivered. 410 Gone disables the endpoint (every instance stops sending to it).
//! Anything else (a 3xx too: no redirect is followed; a timeout; no connection) is tried
//! again after the next wait of the retry schedule, or after `Retry-After` on 429 and 503;
//! after the schedule's last wait the event is recorded failed.

use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{CONTENT_TYPE, HeaderMap, LOCATION, RETRY_AFTER};

use super::WebhookSettings;
use super::sign::SigningKeys;
use super::store::{Claimed, Deliveries};
use crate::metrics::Metrics;
use crate::worker::Worker;

const DAY: Duration = Duration::from_secs(24 * 3600);

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

/// Sends the events to the endpoint, for as long as the service runs.
pub struct Deliverer {
    deliveries: Deliveries,
    http: reqwest::Client,
    url: String,
    key: SigningKeys,
    settings: WebhookSettings,
    metrics: Metrics,
}

impl Deliverer {
    /// The deliverer of `settings`' endpoint, if one is configured.
    pub fn new(
        deliveries: Deliveries,
        settings: &WebhookSettings,
        metrics: &Metrics,
    ) -> Result<Option<Deliverer>, String> {
        let (Some(url), Some(secret)) = (&settings.url, &settings.secret) else {
            return Ok(None);
        };
        let key = SigningKeys::parse(secret).map_err(|e| format!("CHECKOUT_WEBHOOK_SECRET {e}"))?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(settings.timeout)
            .build()
            .map_err(|e| format!("the webhook client: {e}"))?;
        Ok(Some(Deliverer {
            deliveries,
            http,
            url: url.clone(),
            key,
            settings: settings.clone(),
            metrics: metrics.clone(),
        }))
    }

    async fn deliver_for_ever(self) {
        let first = self.settings.retry_schedule.first().copied();
        let poll = first
            .unwrap_or(Duration::from_secs(1))
            .clamp(Duration::from_millis(20), Duration::from_secs(1));
        let lease_ms = millis(self.settings.lease);
        let mut counted = Instant::now() - Duration::from_secs(1);
        let mut gone_logged = false;
        loop {
            if counted.elapsed() >= Duration::from_secs(1) {
                counted = Instant::now();
                if let Ok(backlog) = self.deliveries.backlog().await {
                    self.metrics
                        .webhook_backlog(backlog.pending, backlog.oldest_age_ms);
                }
            }
            let claimed = match self.deliveries.claim(&self.url, lease_ms, 16).await {
                Ok(claimed) => claimed,
                Err(err) => {
                    tracing::warn!(error = %err, "webhooks: cannot claim events; trying again");
                    Vec::new()
                }
            };
            if claimed.is_empty() {
                if !gone_logged && self.deliveries.disabled(&self.url).await.unwrap_or(false) {
                    gone_logged = true;
                    tracing::error!(url = %self.url, "webhooks: the endpoint answered 410 Gone and is disabled; events wait for another CHECKOUT_WEBHOOK_URL (docs/webhooks.md)");
                }
                tokio::time::sleep(poll).await;
                continue;
            }
            for row in claimed {
                self.deliver(row).await;
            }
        }
    }

    async fn deliver(&self, row: Claimed) {
        let attempt = self.send(&row).await;
        let schedule = &self.settings.retry_schedule;
        let retries_done = usize::try_from(row.attempts.saturating_sub(1)).unwrap_or(0);
        let recorded = match attempt {
            Attempt::Delivered => {
                self.metrics.webhook_delivery("delivered");
                tracing::info!(event = %row.id, attempt = row.attempts, "webhooks: event delivered");
                self.deliveries.delivered(&row).await
            }
            Attempt::Gone => {
                self.metrics.webhook_delivery("gone");
                tracing::error!(event = %row.id, url = %self.url, "webhooks: the endpoint answered 410 Gone; it is disabled, nothing more is sent to it");
                self.deliveries.disable(&self.url, &row, "410 Gone").await
            }
            Attempt::Again { error, .. } if retries_done >= schedule.len() => {
                self.metrics.webhook_delivery("failed");
                tracing::error!(event = %row.id, attempts = row.attempts, %error, "webhooks: out of retries; the event is recorded failed");
                self.deliveries.failed(&row, &error).await
            }
            Attempt::Again { error, after } => {
                self.metrics.webhook_delivery("retried");
                // Retry-After lengthens the schedule's wait, never shortens it; a day at most.
                let step = schedule[retries_done];
                let wait = after.map_or(step, |after| after.min(DAY).max(step));
                tracing::warn!(event = %row.id, attempt = row.attempts, %error, retry_in_ms = millis(wait), "webhooks: not delivered; trying again later");
                self.deliveries
                    .retry_later(&row, &error, millis(wait))
                    .await
            }
        };
        if let Err(err) = recorded {
            // The lease lapses and the event is claimed again: at worst a second delivery
            // with the same webhook-id.
            tracing::warn!(event = %row.id, error = %err, "webhooks: cannot record a delivery's outcome");
        }
    }

    async fn send(&self, row: &Claimed) -> Attempt {
        let timestamp = chrono::Utc::now().timestamp();
        let sent = self
            .http
            .post(&self.url)
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", &row.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header(
                "webhook-signature",
                self.key.sign(&row.id, timestamp, &row.body),
            )
            .body(row.body.clone())
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

    /// Claims and sends due events; polls when none is due (events are written by every
    /// instance's stores, and retries fall due by the clock).
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
