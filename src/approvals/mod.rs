//! Approvals: a charge above an amount waits for a person. The charge tool finds none
//! approved and the loop stops, its journal kept; [`Approvals::pause`] records the
//! approval and saves the operation's 202 in one transaction. Approving reopens the record
//! under a new lease in the approval's transaction, and the loop resumes from its journal;
//! denying or expiring replaces the 202 with the operation's final answer, likewise. So an
//! approval is pending exactly while its operation's record holds the 202, whatever
//! crashes in between: nothing runs while it waits, and nothing is left paused once
//! it is decided.
//!
//! Every decision is a conditional update from `pending` (the first one wins, on any
//! instance); a pending approval past its `expires_at` counts as expired at once, before
//! the sweep marks it.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

mod links;

pub use links::{LinkDecision, Links};

use links::{LINK, token_hash};

use crate::db::{BeginWrite, Conn, Database, StoreError, on_conn};
use crate::idempotency::{Lease, PAUSE, REOPEN, SETTLE_PAUSED, Saved};
use crate::journal;
use crate::payments::{Currency, Effect, Money, Order};
use crate::webhooks::{self, Announce, EventType};

/// Where an approval stands.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pending,
    Approved,
    Denied,
    Expired,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Approved => "approved",
            Status::Denied => "denied",
            Status::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> Option<Status> {
        [
            Status::Pending,
            Status::Approved,
            Status::Denied,
            Status::Expired,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One operation's approval, as read (its status as of the database's clock: a pending
/// one past its expiry reads as expired).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Approval {
    pub id: Uuid,
    /// What the operation waits to do.
    pub kind: Effect,
    pub caller: String,
    pub operation_key: String,
    pub order_id: String,
    pub amount: Money,
    pub status: Status,
    pub reason: Option<String>,
    pub decided_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub decided_at: Option<DateTime<Utc>>,
}

/// What a decision found.
#[derive(Debug)]
pub enum Decided {
    /// This call decided it; an approval comes with the fence of the lease it took on the
    /// operation (`None` when its record is gone: it expired unanswered).
    Now(Approval, Option<i64>),
    /// It was decided before (or expired): as it stands.
    Before(Approval),
    /// No approval has this id.
    Missing,
}

/// What a pause found.
#[derive(Debug)]
pub enum Paused {
    /// The approval is pending and the operation's 202 saved.
    Now(Approval),
    /// The run no longer holds the operation's lease: nothing was written.
    LeaseLost,
    /// The approval was decided already (a run that paused before a crash, resumed): the
    /// run goes on with it.
    Decided(Approval),
}

/// The approvals of the service's database.
#[derive(Clone, Debug)]
pub struct Approvals {
    db: Database,
    /// How long an approval waits for a decision.
    ttl: Duration,
    /// `approval.requested` and the decisions' events, written with them.
    events: Announce<Approval>,
}

const ASK: &str = "\
    INSERT INTO approvals (id, caller, operation_key, order_id, amount_minor, currency, status, created_at, expires_at, kind) \
    SELECT $1, $2, $3, $4, $5, $6, 'pending', now_ms, now_ms + $7, $8 FROM clock WHERE true \
    ON CONFLICT (caller, operation_key) DO NOTHING";

/// The decisions: from `pending`, before the expiry, once.
const APPROVE: &str = "\
    UPDATE approvals SET status = 'approved', decided_by = $2, decided_at = (SELECT now_ms FROM clock) \
    WHERE id = $1 AND status = 'pending' AND expires_at > (SELECT now_ms FROM clock) \
    RETURNING caller, operation_key";
const DENY: &str = "\
    UPDATE approvals SET status = 'denied', decided_by = $2, reason = $3, decided_at = (SELECT now_ms FROM clock) \
    WHERE id = $1 AND status = 'pending' AND expires_at > (SELECT now_ms FROM clock) \
    RETURNING caller";
const EXPIRE: &str = "\
    UPDATE approvals SET status = 'expired', decided_by = $2, reason = $3, decided_at = (SELECT now_ms FROM clock) \
    WHERE id = $1 AND status = 'pending' AND expires_at <= (SELECT now_ms FROM clock) \
    RETURNING caller";

/// Pending approvals past their expiry, 64 at most (a limit written in the text, which
/// SQLite keeps prepared: see `db::sqlite_test`).
const DUE: &str = "\
    SELECT CAST(id AS TEXT) FROM approvals, clock \
    WHERE status = 'pending' AND expires_at <= now_ms ORDER BY expires_at LIMIT 64";

const PENDING: &str = "\
    SELECT COUNT(*) FROM approvals, clock WHERE status = 'pending' AND expires_at > now_ms";

impl Approvals {
    pub fn new(db: &Database, ttl: Duration) -> Approvals {
        Approvals {
            db: db.clone(),
            ttl,
            events: Announce::none(),
        }
    }

    /// These approvals, writing the events `events` wants with the request and the
    /// decisions.
    pub fn announcing(mut self, events: Announce<Approval>) -> Self {
        self.events = events;
        self
    }

    /// The event `t` of the approval `id` as it stands in `tx`, written there, if wanted.
    async fn announce(&self, conn: Conn<'_>, id: Uuid, t: EventType) -> Result<(), StoreError> {
        if !self.events.wants(t) {
            return Ok(());
        }
        let mut conn = conn;
        let approval = get(conn.reborrow(), id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("approval {id} vanished as decided")))?;
        let at = approval.decided_at.unwrap_or(approval.created_at);
        webhooks::insert_some(conn, self.events.event(t, &approval, at).as_ref()).await
    }

    /// The approval of `caller`'s operation `operation_key`, if it has one.
    pub async fn find(
        &self,
        caller: &str,
        operation_key: &str,
    ) -> Result<Option<Approval>, StoreError> {
        let mut conn = self.db.acquire().await?;
        let row: Option<Row> = on_conn!(conn.conn(), c => sqlx::query_as(OF_OPERATION)
            .bind(caller)
            .bind(operation_key)
            .fetch_optional(c)
            .await?);
        row.map(Row::into_approval).transpose()
    }

    /// Pauses the run that holds `lease` on its operation for `order`'s approval: the
    /// approval recorded (pending, unless the operation has one), and, while it is
    /// pending, `answer` saved as the operation's 202, the record and its journal kept
    /// until the approval expires and `keep` after; all in one transaction.
    pub async fn pause(
        &self,
        lease: &Lease,
        order: &Order,
        kind: Effect,
        keep: Duration,
        links: Option<&Links>,
        answer: impl FnOnce(&Approval) -> Saved,
    ) -> Result<Paused, StoreError> {
        let amount = order.amount();
        let id = Uuid::now_v7().hyphenated().to_string();
        let (caller, key) = (lease.caller.as_str(), lease.key.as_str());
        let mut conn = self.db.acquire().await?;
        on_conn!(conn.conn(), c => {
            let mut tx = c.begin_write().await?;
            let asked = sqlx::query(ASK)
                .bind(&id)
                .bind(caller)
                .bind(key)
                .bind(order.id().as_str())
                .bind(amount.minor())
                .bind(amount.currency().code())
                .bind(millis(self.ttl))
                .bind(kind.as_str())
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            let row: Row = sqlx::query_as(OF_OPERATION)
                .bind(caller)
                .bind(key)
                .fetch_one(&mut *tx)
                .await?;
            let approval = row.into_approval()?;
            if approval.status != Status::Pending {
                return Ok(Paused::Decided(approval));
            }
            let saved = answer(&approval);
            let until = approval.expires_at.timestamp_millis().saturating_add(millis(keep));
            let paused = sqlx::query(PAUSE)
                .bind(caller)
                .bind(key)
                .bind(lease.fence)
                .bind(saved.content_type.as_str())
                .bind(saved.body.as_slice())
                .bind(until)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if paused != 1 {
                // Rolled back: an approval of a run that lost its lease is its
                // successor's to record.
                return Ok(Paused::LeaseLost);
            }
            sqlx::query(journal::HOLD)
                .bind(caller)
                .bind(key)
                .bind(until)
                .execute(&mut *tx)
                .await?;
            if let Some(links) = links.filter(|_| asked) {
                for (token, decision) in [
                    (&links.approve, LinkDecision::Approve),
                    (&links.deny, LinkDecision::Deny),
                ] {
                    sqlx::query(LINK)
                        .bind(token_hash(token))
                        .bind(&id)
                        .bind(decision.as_str())
                        .execute(&mut *tx)
                        .await?;
                }
            }
            // Announced once: by the pause that asked for it, with its links.
            let requested = asked
                .then(|| {
                    self.events.event_with(
                        EventType::ApprovalRequested,
                        &approval,
                        approval.created_at,
                        links.map(|l| &l.announced),
                    )
                })
                .flatten();
            webhooks::insert_some(Conn::from(&mut *tx), requested.as_ref()).await?;
            tx.commit().await?;
            Ok(Paused::Now(approval))
        })
    }

    /// The approval `id`.
    pub async fn get(&self, id: Uuid) -> Result<Option<Approval>, StoreError> {
        let mut conn = self.db.acquire().await?;
        get(conn.conn(), id).await
    }

    /// Up to `limit` approvals, newest first: of one status, of one caller, or all.
    pub async fn list(
        &self,
        status: Option<Status>,
        caller: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        let mut conn = self.db.acquire().await?;
        let rows: Vec<Row> = on_conn!(conn.conn(), c => sqlx::query_as(LIST)
            .bind(status.map(Status::as_str))
            .bind(caller)
            .bind(limit)
            .fetch_all(c)
            .await?);
        rows.into_iter().map(Row::into_approval).collect()
    }

    /// Approves `id` for `by`, if it is still pending, and in the same transaction
    /// reopens its operation under a new lease of `lease` for the caller of this to run
    /// (see `http::approvals`); if that caller dies, the lease lapses and the recovery
    /// sweep runs it.
    pub async fn approve(
        &self,
        id: Uuid,
        by: &str,
        lease: Duration,
    ) -> Result<Decided, StoreError> {
        let mut conn = self.db.acquire().await?;
        let id_text = id.hyphenated().to_string();
        let decided = on_conn!(conn.conn(), c => {
            let mut tx = c.begin_write().await?;
            let approved: Option<(String, String)> = sqlx::query_as(APPROVE)
                .bind(&id_text)
                .bind(by)
                .fetch_optional(&mut *tx)
                .await?;
            let decided = match approved {
                Some((caller, key)) => {
                    let fence = sqlx::query_scalar::<_, i64>(REOPEN)
                        .bind(caller)
                        .bind(key)
                        .bind(millis(lease))
                        .fetch_optional(&mut *tx)
                        .await?;
                    self.announce(Conn::from(&mut *tx), id, EventType::ApprovalApproved)
                        .await?;
                    Some(fence)
                }
                None => None,
            };
            tx.commit().await?;
            decided
        });
        Ok(match get(conn.conn(), id).await? {
            None => Decided::Missing,
            Some(approval) => match decided {
                Some(fence) => Decided::Now(approval, fence),
                None => Decided::Before(approval),
            },
        })
    }

    /// Denies `id` for `by`, if it is still pending, and in the same transaction makes
    /// `answer` the operation's saved answer in place of its 202.
    pub async fn deny(
        &self,
        id: Uuid,
        by: &str,
        reason: Option<&str>,
        answer: impl FnOnce(&Approval) -> Saved,
    ) -> Result<Decided, StoreError> {
        let denied = |a: &Approval| {
            answer(&Approval {
                status: Status::Denied,
                reason: reason.map(str::to_owned),
                decided_by: Some(by.to_owned()),
                ..a.clone()
            })
        };
        self.settle(
            id,
            DENY,
            EventType::ApprovalDenied,
            Some(by),
            reason,
            denied,
        )
        .await
    }

    /// Marks `id` expired if it is pending past its expiry, and in the same transaction
    /// makes `answer` the operation's saved answer in place of its 202.
    pub async fn expire(
        &self,
        id: Uuid,
        answer: impl FnOnce(&Approval) -> Saved,
    ) -> Result<Decided, StoreError> {
        self.settle(id, EXPIRE, EventType::ApprovalExpired, None, None, answer)
            .await
    }

    /// A decision that ends the operation without running it (`DENY`, `EXPIRE`: `$1` id,
    /// `$2` by, `$3` reason): the approval's conditional update and, if it took, `answer`
    /// in place of the operation's 202 and the decision's event `announced`, in one
    /// transaction.
    async fn settle(
        &self,
        id: Uuid,
        decision: &'static str,
        announced: EventType,
        by: Option<&str>,
        reason: Option<&str>,
        answer: impl FnOnce(&Approval) -> Saved,
    ) -> Result<Decided, StoreError> {
        let mut conn = self.db.acquire().await?;
        let Some(approval) = get(conn.conn(), id).await? else {
            return Ok(Decided::Missing);
        };
        let saved = answer(&approval);
        let id_text = id.hyphenated().to_string();
        let decided = on_conn!(conn.conn(), c => {
            let mut tx = c.begin_write().await?;
            let decided: Option<String> = sqlx::query_scalar(decision)
                .bind(&id_text)
                .bind(by)
                .bind(reason)
                .fetch_optional(&mut *tx)
                .await?;
            if decided.is_some() {
                sqlx::query(SETTLE_PAUSED)
                    .bind(approval.caller.as_str())
                    .bind(approval.operation_key.as_str())
                    .bind(i64::from(saved.status))
                    .bind(saved.content_type.as_str())
                    .bind(saved.body.as_slice())
                    .execute(&mut *tx)
                    .await?;
                self.announce(Conn::from(&mut *tx), id, announced).await?;
            }
            tx.commit().await?;
            decided.is_some()
        });
        self.found(conn.conn(), id, decided).await
    }

    /// Pending approvals past their expiry, up to 64: the sweep's.
    pub async fn due(&self) -> Result<Vec<Uuid>, StoreError> {
        let mut conn = self.db.acquire().await?;
        let ids: Vec<String> =
            on_conn!(conn.conn(), c => sqlx::query_scalar(DUE).fetch_all(c).await?);
        ids.iter()
            .map(|id| {
                Uuid::parse_str(id)
                    .map_err(|e| StoreError::Corrupt(format!("approval id {id:?}: {e}")))
            })
            .collect()
    }

    /// Approvals waiting for a decision now, across every instance.
    pub async fn pending(&self) -> Result<i64, StoreError> {
        let mut conn = self.db.acquire().await?;
        Ok(on_conn!(conn.conn(), c => sqlx::query_scalar(PENDING).fetch_one(c).await?))
    }

    async fn found(&self, conn: Conn<'_>, id: Uuid, now: bool) -> Result<Decided, StoreError> {
        Ok(match get(conn, id).await? {
            None => Decided::Missing,
            Some(approval) if now => Decided::Now(approval, None),
            Some(approval) => Decided::Before(approval),
        })
    }
}

/// Approvals as [`Row`] reads them, with the database's time, and `$where`.
macro_rules! select {
    ($where:literal) => {
        concat!(
            "SELECT id, caller, operation_key, order_id, amount_minor, currency, status, ",
            "reason, decided_by, created_at, expires_at, decided_at, kind, now_ms FROM approvals, clock ",
            $where
        )
    };
}

const GET: &str = select!("WHERE id = $1");
const OF_OPERATION: &str = select!("WHERE caller = $1 AND operation_key = $2");
/// The status as it reads: a pending one past its expiry is expired.
const LIST: &str = select!(
    "WHERE ($1 IS NULL OR (CASE WHEN status = 'pending' AND expires_at <= now_ms THEN 'expired' ELSE status END) = $1) \
     AND ($2 IS NULL OR caller = $2) ORDER BY id DESC LIMIT $3"
);

async fn get(conn: Conn<'_>, id: Uuid) -> Result<Option<Approval>, StoreError> {
    let row: Option<Row> = on_conn!(conn, c => sqlx::query_as(GET)
        .bind(id.hyphenated().to_string())
        .fetch_optional(c)
        .await?);
    row.map(Row::into_approval).transpose()
}

/// A row as both databases return it, with the database's time beside it.
#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    caller: String,
    operation_key: String,
    order_id: String,
    amount_minor: i64,
    currency: String,
    status: String,
    reason: Option<String>,
    decided_by: Option<String>,
    created_at: i64,
    expires_at: i64,
    decided_at: Option<i64>,
    kind: String,
    now_ms: i64,
}

impl Row {
    fn into_approval(self) -> Result<Approval, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt(format!("approval {}: {what}", self.id));
        let currency = Currency::parse(&self.currency).map_err(|e| corrupt(e.to_string()))?;
        let mut status = Status::parse(&self.status)
            .ok_or_else(|| corrupt(format!("status {:?}", self.status)))?;
        if status == Status::Pending && self.expires_at <= self.now_ms {
            status = Status::Expired;
        }
        Ok(Approval {
            id: Uuid::parse_str(&self.id).map_err(|e| corrupt(e.to_string()))?,
            amount: Money::from_minor(self.amount_minor, currency)
                .map_err(|e| corrupt(e.to_string()))?,
            status,
            created_at: time(self.created_at),
            expires_at: time(self.expires_at),
            decided_at: self.decided_at.map(time),
            caller: self.caller,
            operation_key: self.operation_key,
            order_id: self.order_id,
            reason: self.reason,
            decided_by: self.decided_by,
            kind: Effect::parse(&self.kind)
                .ok_or_else(|| corrupt(format!("kind {:?}", self.kind)))?,
        })
    }
}

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::sqlite_test::{prepared_again, schema};

    // The sweep asks every second, and counts the pending.
    // Seen failing with `DUE`'s limit a parameter (`LIMIT $1`, 64 bound): prepared again at
    // each of its 3 executions, left 3, right 0.
    #[test]
    fn the_sweeps_statements_stay_prepared_on_sqlite() {
        let db = schema();
        assert_eq!(prepared_again(&db, DUE, &[]), 0, "{DUE}");
        assert_eq!(prepared_again(&db, PENDING, &[]), 0, "{PENDING}");
    }
}
