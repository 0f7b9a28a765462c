//! The endpoints of `webhook_subscriptions`, each with its URL, its events and its secret:
//! those `checkout webhooks add|list|remove` keeps, and CHECKOUT_WEBHOOK_URL's ([`ENV`]),
//! written from the settings at start-up ([`configure`]). An endpoint receives the events
//! of its types written from the moment its row is there (each event's deliveries are
//! written with it); 410 Gone disables it alone, and its events are kept for it until it
//! is enabled again (CHECKOUT_WEBHOOK_URL: another URL configured) or removed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::sign::SigningKeys;
use super::{EventType, Wanted, WebhookSettings};
use crate::db::{Database, StoreError, on_conn};
use crate::secret::Secret;

/// The id of CHECKOUT_WEBHOOK_URL's endpoint.
pub const ENV: &str = "env";

/// An endpoint of `webhook_subscriptions`.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `ep_…`.
    pub id: String,
    pub url: String,
    pub events: Wanted,
    pub secret: Secret,
    /// Epoch milliseconds.
    pub created_at: i64,
    /// Epoch milliseconds, when it answered 410 Gone.
    pub disabled_at: Option<i64>,
}

impl Endpoint {
    /// Whether it is CHECKOUT_WEBHOOK_URL's, written from the settings, not by `add`.
    pub fn from_settings(&self) -> bool {
        self.id == ENV
    }

    /// The secret as `list` shows it: its first characters and how many it lists.
    pub fn shown_secret(&self) -> String {
        let text = self.secret.expose();
        let count = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .count();
        let head: String = text.chars().take(10).collect();
        if count > 1 {
            format!("{head}… ({count} secrets)")
        } else {
            format!("{head}…")
        }
    }
}

/// What `add` was given, checked: a bad URL, event name or secret stores nothing.
#[derive(Debug)]
pub struct NewEndpoint {
    pub url: String,
    pub events: Wanted,
    pub secret: Secret,
    /// Whether the secret was made here (and must be shown once).
    pub generated: bool,
}

impl NewEndpoint {
    /// `url` (http or https, with a host), `events` (`all` by default), `secret` (`whsec_…`,
    /// several during a rotation; one of 32 random bytes is made when none is given).
    pub fn parse(url: &str, events: Option<&str>, secret: Option<&str>) -> Result<Self, String> {
        let parsed =
            reqwest::Url::parse(url).map_err(|e| format!("URL {url:?} is not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(format!(
                "URL {url:?} is not an http:// or https:// URL with a host"
            ));
        }
        let events = match events {
            Some(text) => {
                let wanted =
                    WebhookSettings::parse_events(text).map_err(|e| format!("--events: {e}"))?;
                if wanted.is_empty() {
                    return Err("--events names no event type".into());
                }
                wanted
            }
            None => Wanted::all(),
        };
        let (secret, generated) = match secret {
            Some(text) => {
                let secret = Secret::new(text);
                SigningKeys::parse(&secret).map_err(|e| format!("--secret {e}"))?;
                (secret, false)
            }
            None => {
                let mut bytes = [0u8; 32];
                getrandom::fill(&mut bytes)
                    .map_err(|e| format!("no random bytes for a secret: {e}"))?;
                (
                    Secret::new(format!("whsec_{}", STANDARD.encode(bytes))),
                    true,
                )
            }
        };
        Ok(NewEndpoint {
            url: url.to_owned(),
            events,
            secret,
            generated,
        })
    }
}

/// The events as stored and shown: `all`, or the types separated by commas.
pub fn events_text(events: Wanted) -> String {
    if events == Wanted::all() {
        return "all".into();
    }
    events
        .types()
        .map(EventType::as_str)
        .collect::<Vec<_>>()
        .join(",")
}

/// The event types written now: every endpoint's, CHECKOUT_WEBHOOK_URL's among them (a
/// disabled one's too: its events are kept for it). Shared by the stores that write events
/// and the deliverer that refreshes it.
#[derive(Clone, Debug, Default)]
pub struct Subscribed(Arc<AtomicU8>);

impl Subscribed {
    pub fn new(wanted: Wanted) -> Subscribed {
        Subscribed(Arc::new(AtomicU8::new(wanted.bits())))
    }

    pub fn now(&self) -> Wanted {
        Wanted::from_bits(self.0.load(Ordering::Relaxed))
    }

    pub fn set(&self, wanted: Wanted) {
        self.0.store(wanted.bits(), Ordering::Relaxed);
    }
}

const INSERT: &str = "\
    INSERT INTO webhook_subscriptions (id, url, events, secret, created_at) \
    SELECT $1, $2, $3, $4, now_ms FROM clock";
const LIST: &str = "\
    SELECT id, url, events, secret, created_at, disabled_at FROM webhook_subscriptions \
    ORDER BY created_at, id";
const REMOVE: &str = "DELETE FROM webhook_subscriptions WHERE id = $1";
const REMOVE_DELIVERIES: &str =
    "DELETE FROM webhook_deliveries WHERE subscription = $1 AND status = 'pending'";
/// CHECKOUT_WEBHOOK_URL's endpoint (`$1` URL, `$2` events, `$3` secret), as configured
/// now: another URL than the one that answered 410 is enabled.
const CONFIGURE: &str = "\
    INSERT INTO webhook_subscriptions (id, url, events, secret, created_at) \
    SELECT 'env', $1, $2, $3, now_ms FROM clock WHERE true \
    ON CONFLICT (id) DO UPDATE SET url = excluded.url, events = excluded.events, \
    secret = excluded.secret, \
    disabled_at = CASE WHEN webhook_subscriptions.url = excluded.url \
        THEN webhook_subscriptions.disabled_at END, \
    reason = CASE WHEN webhook_subscriptions.url = excluded.url \
        THEN webhook_subscriptions.reason END";
/// Its deliveries not made yet of the types it no longer takes (`$1` its events).
const UNWANTED: &str = concat!(
    "DELETE FROM webhook_deliveries WHERE subscription = 'env' AND status = 'pending' ",
    "AND event_id IN (SELECT m.id FROM webhook_messages m WHERE NOT ",
    super::takes!("CAST($1 AS TEXT)", "m.type"),
    ")"
);

/// Writes CHECKOUT_WEBHOOK_URL's endpoint as `settings` configure it, with its secret and
/// its events (its deliveries not made yet of other types are dropped); without a URL,
/// removes it and its deliveries not made yet. Then every endpoint.
pub async fn configure(
    db: &Database,
    settings: &WebhookSettings,
) -> Result<Vec<Endpoint>, StoreError> {
    match (&settings.url, &settings.secret) {
        (Some(url), Some(secret)) => {
            let events = events_text(settings.events);
            let mut conn = db.acquire().await?;
            on_conn!(conn.conn(), c => {
                sqlx::query(CONFIGURE)
                    .bind(url)
                    .bind(&events)
                    .bind(secret.expose())
                    .execute(&mut *c)
                    .await?;
                sqlx::query(UNWANTED).bind(&events).execute(&mut *c).await?;
            });
        }
        _ => {
            remove(db, ENV).await?;
        }
    }
    list(db).await
}

/// Stores `new`; its id.
pub async fn add(db: &Database, new: &NewEndpoint) -> Result<String, StoreError> {
    let id = format!("ep_{}", uuid::Uuid::now_v7().simple());
    let mut conn = db.acquire().await?;
    on_conn!(conn.conn(), c => sqlx::query(INSERT)
        .bind(&id)
        .bind(&new.url)
        .bind(events_text(new.events))
        .bind(new.secret.expose())
        .execute(c)
        .await
        .map(drop))?;
    Ok(id)
}

/// Every endpoint, the disabled ones too, oldest first.
pub async fn list(db: &Database) -> Result<Vec<Endpoint>, StoreError> {
    type Row = (String, String, String, String, i64, Option<i64>);
    let mut conn = db.acquire().await?;
    let rows: Vec<Row> = on_conn!(conn.conn(), c => sqlx::query_as(LIST).fetch_all(c).await?);
    rows.into_iter()
        .map(|(id, url, events, secret, created_at, disabled_at)| {
            let events = WebhookSettings::parse_events(&events)
                .map_err(|e| StoreError::Corrupt(format!("webhook endpoint {id}: {e}")))?;
            Ok(Endpoint {
                id,
                url,
                events,
                secret: Secret::new(secret),
                created_at,
                disabled_at,
            })
        })
        .collect()
}

/// Removes the endpoint `id` and its deliveries not made yet; false when there is none.
pub async fn remove(db: &Database, id: &str) -> Result<bool, StoreError> {
    let mut conn = db.acquire().await?;
    let removed = on_conn!(conn.conn(), c => {
        let removed = sqlx::query(REMOVE).bind(id).execute(&mut *c).await?.rows_affected();
        sqlx::query(REMOVE_DELIVERIES).bind(id).execute(&mut *c).await?;
        removed
    });
    Ok(removed == 1)
}

/// The types the endpoints of `endpoints` take, a disabled one's too (its events are
/// kept for it).
pub fn wanted_by(endpoints: &[Endpoint]) -> Wanted {
    Wanted::of(endpoints.iter().flat_map(|e| e.events.types()))
}
