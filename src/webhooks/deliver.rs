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
use super::endpoints::{self, Endpoint, Subscribed};
use super::fanout::{ClaimedDelivery, Fanout};
use super::sign::SigningKeys;
use super::store::{Claimed, Deliveries};
use crate::db::Database;
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

/// What a delivery comes to after an attempt, by the retry schedule.
enum Verdict {
    Delivered,
    Gone,
    Failed(String),
    Later(String, i64),
}

/// CHECKOUT_WEBHOOK_URL, its keys and its types (separated by commas).
struct EnvEndpoint {
    url: String,
    keys: SigningKeys,
    types: String,
}

/// Sends the events to CHECKOUT_WEBHOOK_URL and to the endpoints of `checkout webhooks
/// add`, for as long as the service runs.
pub struct Deliverer {
    deliveries: Deliveries,
    fanout: Fanout,
    db: Database,
    http: reqwest::Client,
    env: Option<EnvEndpoint>,
    /// The types the stores write: the env endpoint's and every enabled endpoint's.
    subscribed: Subscribed,
    settings: WebhookSettings,
    metrics: Metrics,
}

impl Deliverer {
    /// The deliverer of `settings`' endpoint and of the database's, keeping `subscribed`
    /// up to date.
    pub fn new(
        db: &Database,
        settings: &WebhookSettings,
        subscribed: &Subscribed,
        metrics: &Metrics,
    ) -> Result<Deliverer, String> {
        let env = match (&settings.url, &settings.secret) {
            (Some(url), Some(secret)) => Some(EnvEndpoint {
                url: url.clone(),
                keys: SigningKeys::parse(secret)
                    .map_err(|e| format!("CHECKOUT_WEBHOOK_SECRET {e}"))?,
                types: endpoints::events_text_list(settings.wanted()),
            }),
            _ => None,
        };
        // reqwest is built without a crypto provider of its own (as the Stripe client):
        // without this, building the client panics where it wants TLS (HTTPS_PROXY set).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(settings.timeout)
            .build()
            .map_err(|e| format!("the webhook client: {e}"))?;
        Ok(Deliverer {
            deliveries: Deliveries::new(db),
            fanout: Fanout::new(db),
            db: db.clone(),
            http,
            env,
            subscribed: subscribed.clone(),
            settings: settings.clone(),
            metrics: metrics.clone(),
        })
    }

    async fn deliver_for_ever(self) {
        let first = self.settings.retry_schedule.first().copied();
        let poll = first
            .unwrap_or(Duration::from_secs(1))
            .clamp(Duration::from_millis(20), Duration::from_secs(1));
        let lease_ms = millis(self.settings.lease);
        let mut counted = Instant::now() - Duration::from_secs(1);
        let mut gone_logged = false;
        let mut endpoints: Vec<(Endpoint, Option<SigningKeys>)> = Vec::new();
        loop {
            if counted.elapsed() >= Duration::from_secs(1) {
                counted = Instant::now();
                endpoints = self.refresh(endpoints).await;
            }
            let mut busy = false;
            if let Some(env) = &self.env {
                let claimed = match self
                    .deliveries
                    .claim(&env.url, &env.types, lease_ms, 16)
                    .await
                {
                    Ok(claimed) => claimed,
                    Err(err) => {
                        tracing::warn!(error = %err, "webhooks: cannot claim events; trying again");
                        Vec::new()
                    }
                };
                if claimed.is_empty()
                    && !gone_logged
                    && self.deliveries.disabled(&env.url).await.unwrap_or(false)
                {
                    gone_logged = true;
                    tracing::error!(url = %env.url, "webhooks: the endpoint answered 410 Gone and is disabled; events wait for another CHECKOUT_WEBHOOK_URL (docs/webhooks.md)");
                }
                busy |= !claimed.is_empty();
                for row in claimed {
                    self.deliver(env, row).await;
                }
            }
            if !endpoints.is_empty() {
                let listed: Vec<Endpoint> = endpoints.iter().map(|(e, _)| e.clone()).collect();
                match self.fanout.fan_out(&listed, 100).await {
                    Ok(n) => busy |= n > 0,
                    Err(err) => {
                        tracing::warn!(error = %err, "webhooks: cannot fan events out to the endpoints; trying again")
                    }
                }
                let claimed = self.fanout.claim(lease_ms, 16).await.unwrap_or_else(|err| {
                    tracing::warn!(error = %err, "webhooks: cannot claim deliveries; trying again");
                    Vec::new()
                });
                busy |= !claimed.is_empty();
                for row in claimed {
                    let endpoint = endpoints.iter().find(|(e, _)| e.id == row.subscription);
                    if let Some((endpoint, Some(keys))) = endpoint {
                        self.deliver_to(endpoint, keys, row).await;
                    }
                }
            }
            if !busy {
                tokio::time::sleep(poll).await;
            }
        }
    }

    /// The endpoints of the database now, each with its keys; the types written updated, and
    /// the backlog's metrics.
    async fn refresh(
        &self,
        had: Vec<(Endpoint, Option<SigningKeys>)>,
    ) -> Vec<(Endpoint, Option<SigningKeys>)> {
        let now = match endpoints::list(&self.db).await {
            Ok(listed) => listed
                .into_iter()
                .map(|e| {
                    let keys = SigningKeys::parse(&e.secret)
                        .inspect_err(|err| tracing::error!(endpoint = %e.id, "webhooks: the endpoint's stored secret {err}; nothing is sent to it"))
                        .ok();
                    (e, keys)
                })
                .collect(),
            Err(err) => {
                tracing::warn!(error = %err, "webhooks: cannot read the endpoints; trying again");
                had
            }
        };
        let listed: Vec<Endpoint> = now.iter().map(|(e, _)| e.clone()).collect();
        self.subscribed
            .set(self.settings.wanted().and(endpoints::wanted_by(&listed)));
        // With no endpoint at all (neither CHECKOUT_WEBHOOK_URL nor an enabled one of the
        // database), nothing is written and nothing waits for anyone: the backlog is
        // none, known without asking the database every second.
        if self.env.is_none() && now.is_empty() {
            self.metrics.webhook_backlog(0, 0);
            return now;
        }
        let types = self.env.as_ref().map_or("", |env| env.types.as_str());
        if let (Ok(env), Ok((pending, oldest))) = (
            self.deliveries.backlog(types).await,
            self.fanout.backlog().await,
        ) {
            self.metrics
                .webhook_backlog(env.pending + pending, env.oldest_age_ms.max(oldest));
        }
        now
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

    /// One attempt of an event to CHECKOUT_WEBHOOK_URL.
    async fn deliver(&self, env: &EnvEndpoint, row: Claimed) {
        let attempt = self.send(&env.url, &env.keys, &row.id, &row.body).await;
        let recorded = match self.verdict(attempt, row.attempts) {
            Verdict::Delivered => {
                tracing::info!(event = %row.id, attempt = row.attempts, "webhooks: event delivered");
                self.deliveries.delivered(&row).await
            }
            Verdict::Gone => {
                tracing::error!(event = %row.id, url = %env.url, "webhooks: the endpoint answered 410 Gone; it is disabled, nothing more is sent to it");
                self.deliveries.disable(&env.url, &row, "410 Gone").await
            }
            Verdict::Failed(error) => {
                tracing::error!(event = %row.id, attempts = row.attempts, %error, "webhooks: out of retries; the event is recorded failed");
                self.deliveries.failed(&row, &error).await
            }
            Verdict::Later(error, wait_ms) => {
                tracing::warn!(event = %row.id, attempt = row.attempts, %error, retry_in_ms = wait_ms, "webhooks: not delivered; trying again later");
                self.deliveries.retry_later(&row, &error, wait_ms).await
            }
        };
        if let Err(err) = recorded {
            // The lease lapses and the event is claimed again: at worst a second delivery
            // with the same webhook-id.
            tracing::warn!(event = %row.id, error = %err, "webhooks: cannot record a delivery's outcome");
        }
    }

    /// One attempt of an event to an endpoint of the database.
    async fn deliver_to(&self, endpoint: &Endpoint, keys: &SigningKeys, row: ClaimedDelivery) {
        let body = match self.fanout.body(&row.event_id).await {
            Ok(Some(body)) => body,
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(event = %row.event_id, error = %err, "webhooks: cannot read an event; trying again");
                return;
            }
        };
        let attempt = self.send(&endpoint.url, keys, &row.event_id, &body).await;
        let (event, id) = (&row.event_id, &endpoint.id);
        let recorded = match self.verdict(attempt, row.attempts) {
            Verdict::Delivered => {
                tracing::info!(%event, endpoint = %id, attempt = row.attempts, "webhooks: event delivered");
                self.fanout.delivered(&row).await
            }
            Verdict::Gone => {
                tracing::error!(%event, endpoint = %id, url = %endpoint.url, "webhooks: the endpoint answered 410 Gone; it alone is disabled, nothing more is sent to it");
                self.fanout.disable(&row, "410 Gone").await
            }
            Verdict::Failed(error) => {
                tracing::error!(%event, endpoint = %id, attempts = row.attempts, %error, "webhooks: out of retries; the delivery is recorded failed");
                self.fanout.failed(&row, &error).await
            }
            Verdict::Later(error, wait_ms) => {
                tracing::warn!(%event, endpoint = %id, attempt = row.attempts, %error, retry_in_ms = wait_ms, "webhooks: not delivered; trying again later");
                self.fanout.retry_later(&row, &error, wait_ms).await
            }
        };
        if let Err(err) = recorded {
            tracing::warn!(%event, endpoint = %id, error = %err, "webhooks: cannot record a delivery's outcome");
        }
    }

    async fn send(&self, url: &str, keys: &SigningKeys, id: &str, body: &str) -> Attempt {
        let timestamp = chrono::Utc::now().timestamp();
        let sent = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", keys.sign(id, timestamp, body))
            .body(body.to_owned())
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
    /// instance's stores, and retries fall due by the clock). Reads the endpoints of the
    /// database every second.
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
