//! Webhooks: what the service decides, pushed to the operator's endpoint as Standard
//! Webhooks (docs/webhooks.md). An event is a row of `webhook_messages` and one row of
//! `webhook_deliveries` per endpoint that takes its type, written in the transaction of
//! the fact it announces: the store that commits an approval, a decision, a receipt or a
//! refund adds the rows to its own statement or transaction (by the SQL text this module
//! exports), so that no fact commits without its event, nor an event without its fact,
//! and no checkout waits for a round trip of its own for it. Every delivery, to
//! CHECKOUT_WEBHOOK_URL as to the endpoints of `checkout webhooks add`, is then claimed,
//! sent and recorded by one path (`store`, `deliver`); an event's status is its
//! deliveries' (the view `webhook_events`).
//!
//! This module knows no resource: a store is handed an [`Announce`] of its own type when
//! `app` builds it, which says whether its events are wanted and how the API shows the
//! resource (`data`); the event's type is one [`EventType`].

mod deliver;
pub mod endpoints;
mod sign;
mod store;

pub use deliver::Deliverer;
pub use endpoints::Subscribed;
pub use sign::{SigningKey, SigningKeys};
pub use store::{Backlog, Claimed, Deliveries, Outcome};

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::db::{Batch, Conn, Returned, StoreError, on_conn};
use crate::secret::Secret;

/// The operator's endpoint and how events reach it.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// `CHECKOUT_WEBHOOK_URL`: where events are POSTed; none writes no event.
    pub url: Option<String>,
    /// `CHECKOUT_PUBLIC_URL`: the service as a person's browser reaches it; with it,
    /// `approval.requested` carries an approve and a deny link under it.
    pub public_url: Option<String>,
    /// `CHECKOUT_WEBHOOK_SECRET`: `whsec_` + base64 of the HMAC key's 24 to 64 bytes; during
    /// a rotation several, separated by spaces or commas, each signing every request.
    pub secret: Option<Secret>,
    /// `CHECKOUT_WEBHOOK_EVENTS`: the event types sent (all by default).
    pub events: Wanted,
    /// `CHECKOUT_WEBHOOK_RETRY_SCHEDULE`: the waits after each failed attempt; the event
    /// is recorded failed after the last.
    pub retry_schedule: Vec<Duration>,
    /// The most one delivery attempt may take.
    pub timeout: Duration,
    /// How long a deliverer holds a claimed event; another instance's takes it after
    /// that. Longer than the timeout.
    pub lease: Duration,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        let (s, m, h) = (1, 60, 3600);
        WebhookSettings {
            url: None,
            public_url: None,
            secret: None,
            events: Wanted::all(),
            // Standard Webhooks' suggested schedule.
            retry_schedule: [5 * s, 5 * m, 30 * m, 2 * h, 5 * h, 10 * h, 10 * h]
                .map(Duration::from_secs)
                .to_vec(),
            timeout: Duration::from_secs(15),
            lease: Duration::from_secs(60),
        }
    }
}

impl WebhookSettings {
    /// Reads `CHECKOUT_WEBHOOK_RETRY_SCHEDULE`: waits such as `5s,5m,30m,2h` (units `ms`,
    /// `s`, `m`, `h`), one to twenty of them.
    pub fn parse_schedule(text: &str) -> Result<Vec<Duration>, String> {
        let waits = text
            .split(',')
            .map(|step| {
                let step = step.trim();
                let split = step
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(step.len());
                let (number, unit) = step.split_at(split);
                let n: u64 = number
                    .parse()
                    .map_err(|_| format!("{step:?} is not a wait such as 5s, 5m or 2h"))?;
                let ms = match unit {
                    "ms" => 1,
                    "s" => 1000,
                    "m" => 60_000,
                    "h" => 3_600_000,
                    _ => return Err(format!("{step:?}: the unit is one of ms, s, m, h")),
                };
                Ok(Duration::from_millis(n.saturating_mul(ms)))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if waits.len() > 20 {
            return Err(format!("{} waits; at most 20", waits.len()));
        }
        Ok(waits)
    }

    /// Reads `CHECKOUT_WEBHOOK_EVENTS`: `all`, or event types separated by commas.
    pub fn parse_events(text: &str) -> Result<Wanted, String> {
        if text.trim() == "all" {
            return Ok(Wanted::all());
        }
        let types = text
            .split(',')
            .map(|t| {
                EventType::parse(t.trim()).ok_or_else(|| {
                    let known: Vec<_> = EventType::ALL.iter().map(|t| t.as_str()).collect();
                    format!("{t:?} is not an event type ({}, or all)", known.join(", "))
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Wanted::of(types))
    }

    /// The event types written: none without an endpoint.
    pub fn wanted(&self) -> Wanted {
        if self.url.is_some() {
            self.events
        } else {
            Wanted::none()
        }
    }
}

/// What an event announces: its `type`, as the body and `CHECKOUT_WEBHOOK_EVENTS` name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventType {
    /// A charge (or a refund) waits for a person's approval.
    #[serde(rename = "approval.requested")]
    ApprovalRequested,
    #[serde(rename = "approval.approved")]
    ApprovalApproved,
    #[serde(rename = "approval.denied")]
    ApprovalDenied,
    /// Nobody decided before the approval's expiry.
    #[serde(rename = "approval.expired")]
    ApprovalExpired,
    /// An order was charged: its receipt committed.
    #[serde(rename = "charge.succeeded")]
    ChargeSucceeded,
    /// A refund went through: the ledger's at once, a provider's when it answered.
    #[serde(rename = "refund.succeeded")]
    RefundSucceeded,
    /// A caller's day crossed 80 or 100 % of its budget (once per caller, currency, day
    /// and threshold).
    #[serde(rename = "budget.threshold")]
    BudgetThreshold,
}

impl EventType {
    pub const ALL: [EventType; 7] = [
        EventType::ApprovalRequested,
        EventType::ApprovalApproved,
        EventType::ApprovalDenied,
        EventType::ApprovalExpired,
        EventType::ChargeSucceeded,
        EventType::RefundSucceeded,
        EventType::BudgetThreshold,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::ApprovalRequested => "approval.requested",
            EventType::ApprovalApproved => "approval.approved",
            EventType::ApprovalDenied => "approval.denied",
            EventType::ApprovalExpired => "approval.expired",
            EventType::ChargeSucceeded => "charge.succeeded",
            EventType::RefundSucceeded => "refund.succeeded",
            EventType::BudgetThreshold => "budget.threshold",
        }
    }

    pub fn parse(text: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == text)
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The event types written: those the endpoint takes; none without an endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wanted(u8);

impl Wanted {
    pub fn none() -> Wanted {
        Wanted(0)
    }

    pub fn all() -> Wanted {
        Wanted::of(EventType::ALL)
    }

    pub fn of(types: impl IntoIterator<Item = EventType>) -> Wanted {
        Wanted(types.into_iter().fold(0, |bits, t| bits | bit(t)))
    }

    pub fn wants(self, t: EventType) -> bool {
        self.0 & bit(t) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The types of `self` and of `other`.
    pub fn and(self, other: Wanted) -> Wanted {
        Wanted(self.0 | other.0)
    }

    fn bits(self) -> u8 {
        self.0
    }

    fn from_bits(bits: u8) -> Wanted {
        Wanted(bits)
    }

    /// The types, in [`EventType::ALL`]'s order.
    pub fn types(self) -> impl Iterator<Item = EventType> {
        EventType::ALL.into_iter().filter(move |t| self.wants(*t))
    }
}

fn bit(t: EventType) -> u8 {
    1 << EventType::ALL.iter().position(|x| *x == t).unwrap_or(0)
}

/// How a store announces its resource `T`: which of its events are wanted, and `T` as the
/// API shows it (the event's `data`). Handed to the store by `app`, which knows the API.
pub struct Announce<T> {
    wanted: Subscribed,
    view: Option<fn(&T) -> serde_json::Value>,
}

impl<T> Announce<T> {
    /// No event is written.
    pub fn none() -> Announce<T> {
        Announce {
            wanted: Subscribed::default(),
            view: None,
        }
    }

    /// The events `wanted` takes at the time each is made.
    pub fn new(wanted: &Subscribed, view: fn(&T) -> serde_json::Value) -> Announce<T> {
        Announce {
            wanted: wanted.clone(),
            view: Some(view),
        }
    }

    /// Whether events of type `t` are written.
    pub fn wants(&self, t: EventType) -> bool {
        self.view.is_some() && self.wanted.now().wants(t)
    }

    /// The event `t` of `of` at `at`, if it is wanted.
    pub fn event(&self, t: EventType, of: &T, at: DateTime<Utc>) -> Option<NewEvent> {
        self.event_with(t, of, at, None)
    }

    /// [`event`](Self::event), its `data` with the fields of `more` besides the view's.
    pub fn event_with(
        &self,
        t: EventType,
        of: &T,
        at: DateTime<Utc>,
        more: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Option<NewEvent> {
        let view = self.view.filter(|_| self.wanted.now().wants(t))?;
        let mut data = view(of);
        if let (Some(fields), Some(more)) = (data.as_object_mut(), more) {
            fields.extend(more.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        Some(NewEvent::new(t, data, at))
    }
}

impl<T> Clone for Announce<T> {
    fn clone(&self) -> Self {
        Announce {
            wanted: self.wanted.clone(),
            view: self.view,
        }
    }
}

impl<T> Default for Announce<T> {
    fn default() -> Self {
        Announce::none()
    }
}

impl<T> std::fmt::Debug for Announce<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Announce")
            .field("wanted", &self.wanted.now())
            .finish_non_exhaustive()
    }
}

/// An event to write: its id (`webhook-id`) and its body, rendered once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEvent {
    pub id: String,
    pub kind: EventType,
    /// `{"type","timestamp","data"}`, as it is sent and signed.
    pub body: String,
}

/// An event's body, as Standard Webhooks suggests it.
#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: EventType,
    /// RFC 3339, UTC: when the fact happened.
    timestamp: String,
    data: &'a serde_json::Value,
}

impl NewEvent {
    pub fn new(kind: EventType, data: serde_json::Value, at: DateTime<Utc>) -> NewEvent {
        let body = Body {
            kind,
            timestamp: at.to_rfc3339_opts(SecondsFormat::Millis, true),
            data: &data,
        };
        NewEvent {
            id: format!("msg_{}", uuid::Uuid::now_v7().simple()),
            kind,
            body: serde_json::to_string(&body).expect("a JSON value serializes"),
        }
    }
}

/// Whether the events text `$events` (`all`, or types separated by commas, as
/// `webhook_subscriptions.events` holds it) takes the type `$type`: SQL text.
macro_rules! takes {
    ($events:literal, $type:literal) => {
        concat!(
            "(",
            $events,
            " = 'all' OR (',' || ",
            $events,
            " || ',') LIKE ('%,' || ",
            $type,
            " || ',%'))"
        )
    };
}
pub(crate) use takes;

/// One event, in the caller's transaction: `$1` id, `$2` type, `$3` body.
pub const INSERT: &str = "\
    INSERT INTO webhook_messages (id, type, body, created_at) \
    SELECT $1, $2, $3, now_ms FROM clock WHERE true \
    ON CONFLICT (id) DO NOTHING";

/// Its deliveries, in the same transaction: one to each endpoint that takes its type
/// (`$1` id, `$2` type). A disabled endpoint's are kept for it.
pub const DELIVERIES: &str = concat!(
    "INSERT INTO webhook_deliveries (event_id, subscription, next_attempt_at, created_at) ",
    "SELECT $1, s.id, c.now_ms, c.now_ms FROM webhook_subscriptions s, clock c WHERE ",
    takes!("s.events", "CAST($2 AS TEXT)"),
    " ON CONFLICT DO NOTHING"
);

/// Writes `event` and its deliveries on `conn` (a transaction of the fact it announces).
pub async fn insert(conn: Conn<'_>, event: &NewEvent) -> Result<(), StoreError> {
    on_conn!(conn, c => {
        sqlx::query(INSERT)
            .bind(&event.id)
            .bind(event.kind.as_str())
            .bind(&event.body)
            .execute(&mut *c)
            .await?;
        sqlx::query(DELIVERIES)
            .bind(&event.id)
            .bind(event.kind.as_str())
            .execute(&mut *c)
            .await?;
    });
    Ok(())
}

/// Writes `event`, if there is one.
pub async fn insert_some(conn: Conn<'_>, event: Option<&NewEvent>) -> Result<(), StoreError> {
    match event {
        Some(event) => insert(conn, event).await,
        None => Ok(()),
    }
}

/// Postgres: CTEs for a statement whose CTE `charged` returns the receipts it made (`id`
/// as text): the events of those receipts, from arrays `$22` (event ids), `$23` (the
/// receipt each announces), `$24` (types), `$25` (bodies), and their deliveries. A receipt
/// that did not go in has no event.
macro_rules! pg_events_of_charged {
    () => {
        concat!(
            "charge_events AS (",
            "INSERT INTO webhook_messages (id, type, body, created_at) ",
            "SELECT e.id, e.type, e.body, c.now_ms ",
            "FROM UNNEST($22::text[], $23::text[], $24::text[], $25::text[]) AS e(id, receipt, type, body), clock c ",
            "WHERE e.receipt IN (SELECT id FROM charged) ",
            "RETURNING id, type, created_at), ",
            "charge_deliveries AS (",
            "INSERT INTO webhook_deliveries (event_id, subscription, next_attempt_at, created_at) ",
            "SELECT e.id, s.id, e.created_at, e.created_at FROM charge_events e, webhook_subscriptions s ",
            "WHERE ",
            $crate::webhooks::takes!("s.events", "e.type"),
            ")"
        )
    };
}
pub(crate) use pg_events_of_charged;

/// SQLite: the events of receipts a batch statement before it made, from one JSON array of
/// rows `[id, receipt, type, body]` (`db::Batch::push_rows`), then their deliveries: a
/// receipt's id is new, so it is in the table only if that statement put it there.
pub fn push_sqlite(batch: &mut Batch, events: &[(&NewEvent, &str)]) {
    let rows: Vec<_> = events
        .iter()
        .map(|(e, receipt)| (&e.id, receipt, e.kind.as_str(), &e.body))
        .collect();
    batch.push_rows(SQLITE_EVENTS_OF_CHARGED, rows);
    let ids: Vec<_> = events.iter().map(|(e, _)| [&e.id]).collect();
    batch.push_rows(SQLITE_DELIVERIES_OF_CHARGED, ids);
}

/// Passes over what [`push_sqlite`]'s statements returned (nothing).
pub fn skip_sqlite(returned: &mut Returned) {
    returned.skip();
    returned.skip();
}

const SQLITE_EVENTS_OF_CHARGED: &str = "\
    INSERT INTO webhook_messages (id, type, body, created_at) \
    SELECT value ->> 0, value ->> 2, value ->> 3, (SELECT now_ms FROM clock) \
    FROM jsonb_each(?) WHERE EXISTS (SELECT 1 FROM receipts r WHERE r.id = value ->> 1) \
    ON CONFLICT (id) DO NOTHING";

/// Rows `[id]` of the events just written.
const SQLITE_DELIVERIES_OF_CHARGED: &str = concat!(
    "INSERT INTO webhook_deliveries (event_id, subscription, next_attempt_at, created_at) ",
    "SELECT m.id, s.id, m.created_at, m.created_at ",
    "FROM jsonb_each(?) j JOIN webhook_messages m ON m.id = j.value ->> 0, webhook_subscriptions s ",
    "WHERE ",
    takes!("s.events", "m.type"),
    " ON CONFLICT DO NOTHING"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_reads_back_as_it_is_written_and_its_serde_name_is_its_name() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
            assert_eq!(
                serde_json::to_value(t).unwrap(),
                serde_json::Value::from(t.as_str())
            );
        }
        assert_eq!(EventType::parse("charge.failed"), None);
    }

    #[test]
    fn wanted_holds_exactly_the_types_it_was_given() {
        let w = Wanted::of([EventType::ChargeSucceeded, EventType::ApprovalExpired]);
        assert_eq!(
            w.types().collect::<Vec<_>>(),
            [EventType::ApprovalExpired, EventType::ChargeSucceeded]
        );
        assert!(Wanted::none().is_empty());
        assert_eq!(Wanted::all().types().count(), 7);
    }

    #[test]
    fn a_schedule_reads_its_units_and_events_their_names() {
        let default = WebhookSettings::default().retry_schedule;
        assert_eq!(
            WebhookSettings::parse_schedule("5s,5m,30m,2h,5h,10h,10h").unwrap(),
            default
        );
        assert_eq!(
            WebhookSettings::parse_schedule("100ms, 1s").unwrap(),
            [Duration::from_millis(100), Duration::from_secs(1)]
        );
        for bad in ["", "5", "5d", "s", "1s,,2s"] {
            assert!(WebhookSettings::parse_schedule(bad).is_err(), "{bad:?}");
        }
        assert_eq!(WebhookSettings::parse_events("all").unwrap(), Wanted::all());
        assert_eq!(
            WebhookSettings::parse_events("charge.succeeded, approval.requested").unwrap(),
            Wanted::of([EventType::ChargeSucceeded, EventType::ApprovalRequested])
        );
        assert!(WebhookSettings::parse_events("charge.failed").is_err());
    }

    #[test]
    fn a_body_is_type_timestamp_and_data() {
        let at = DateTime::from_timestamp_millis(1_765_000_000_123).unwrap();
        let e = NewEvent::new(
            EventType::ChargeSucceeded,
            serde_json::json!({"orderId": "A-1"}),
            at,
        );
        assert!(e.id.starts_with("msg_"));
        assert_eq!(
            e.body,
            r#"{"type":"charge.succeeded","timestamp":"2025-12-06T05:46:40.123Z","data":{"orderId":"A-1"}}"#
        );
    }
}
