//! The refunds table and the receipts' `refunded_minor`: money back, never more than was
//! charged. A refund is one transaction: the receipt's `refunded_minor` moved by a
//! conditional update (re-evaluated on the row's latest version under its lock, so two
//! refunds racing on any instances cannot both pass the charge; a CHECK holds it within
//! the amount whatever writes it), then the refund's row, unique per operation (a repeat
//! finds it), then the journal entries of its tool result. Every statement is one text
//! for both databases; only the id's and time's types are bound per driver.

use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use uuid::Uuid;

use crate::db::{BeginWrite, Conn, Database, StoreError, on_conn};
use crate::journal::wake::Wake;
use crate::journal::{self, NewEntry};
use crate::payments::keys::OrderId;
use crate::payments::money::{Currency, Money, decimal_minor};
use crate::webhooks::{self, Announce, EventType, NewEvent};

/// A refund, as its row says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refund {
    pub id: Uuid,
    pub order_id: OrderId,
    pub receipt_id: Uuid,
    pub amount: Money,
    /// The operation that made it: the refund key.
    pub operation_key: String,
    pub caller: String,
    pub reason: Option<String>,
    pub status: RefundStatus,
    /// The payment provider's id of the refund (Stripe's `re_…`); `None` for the ledger's.
    pub provider_refund_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefundStatus {
    /// Reserved against the charge; the payment provider is being asked.
    Pending,
    Succeeded,
    /// The provider refused it; its amount was given back to the charge.
    Failed,
}

impl RefundStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RefundStatus::Pending => "pending",
            RefundStatus::Succeeded => "succeeded",
            RefundStatus::Failed => "failed",
        }
    }

    fn parse(text: &str) -> Option<RefundStatus> {
        [
            RefundStatus::Pending,
            RefundStatus::Succeeded,
            RefundStatus::Failed,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// A refund to make: what the handler authorized, under the operation's key.
#[derive(Clone, Debug)]
pub struct NewRefund<'a> {
    pub order_id: &'a OrderId,
    pub amount: Money,
    pub operation_key: &'a str,
    pub caller: &'a str,
    pub reason: Option<&'a str>,
    /// `Pending` with a payment provider (asked after this commits), else `Succeeded`.
    pub status: RefundStatus,
}

/// What a refund did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefundOutcome {
    /// This call made the refund (its amount is reserved against the charge).
    Created(Refund),
    /// This operation's refund was made before; nothing changed.
    Existing(Refund),
    /// The refund would pass what the order was charged: nothing was written. The
    /// charge and what was refunded of it.
    Exceeds(Refunded),
    /// The order has no receipt (in this currency).
    NotCharged,
}

/// An order's charge and what was refunded of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refunded {
    pub charged: Money,
    /// Minor units refunded (pending refunds included): 0 or more.
    pub refunded_minor: i64,
}

impl Refunded {
    /// Minor units left to refund.
    pub fn left_minor(&self) -> i64 {
        (self.charged.minor() - self.refunded_minor).max(0)
    }

    /// What is left to refund, `None` when nothing is.
    pub fn left(&self) -> Option<Money> {
        Money::from_minor(self.left_minor(), self.charged.currency()).ok()
    }

    /// What is left, as a decimal: `10.00`, `0.00`.
    pub fn left_decimal(&self) -> String {
        decimal_minor(self.left_minor(), self.charged.currency())
    }

    /// What was refunded, as a decimal.
    pub fn refunded_decimal(&self) -> String {
        decimal_minor(self.refunded_minor, self.charged.currency())
    }
}

const RESERVE: &str = "\
    UPDATE receipts SET refunded_minor = refunded_minor + $2 \
    WHERE order_id = $1 AND currency = $3 AND refunded_minor + $2 <= amount_minor \
    RETURNING order_id";

const RELEASE: &str = "\
    UPDATE receipts SET refunded_minor = refunded_minor - $2 \
    WHERE order_id = $1 AND refunded_minor >= $2";

const INSERT: &str = "\
    INSERT INTO refunds (id, order_id, receipt_id, amount_minor, currency, operation_key, \
    caller, reason, status, provider_refund_id, created_at) \
    SELECT $1, r.order_id, r.id, $3, r.currency, $4, $5, $6, $7, NULL, $8 \
    FROM receipts r WHERE r.order_id = $2 \
    ON CONFLICT (operation_key, caller) DO NOTHING RETURNING CAST(id AS TEXT)";

macro_rules! select {
    ($where:literal) => {
        concat!(
            "SELECT CAST(id AS TEXT) AS id, order_id, CAST(receipt_id AS TEXT) AS receipt_id, ",
            "amount_minor, currency, operation_key, caller, reason, status, provider_refund_id, ",
            "created_at FROM refunds ",
            $where
        )
    };
}

const BY_OPERATION: &str = select!("WHERE operation_key = $1 AND caller = $2");
const OF_ORDER: &str = select!("WHERE order_id = $1 ORDER BY created_at, id");

const REFUNDED: &str =
    "SELECT amount_minor, refunded_minor, currency FROM receipts WHERE order_id = $1";

const SETTLE: &str = "\
    UPDATE refunds SET status = $3, provider_refund_id = COALESCE($4, provider_refund_id) \
    WHERE operation_key = $1 AND caller = $2 AND status = 'pending'";

/// The refunds of the service's database.
#[derive(Clone, Debug)]
pub struct Refunds {
    db: Database,
    /// The streams to tell when a refund's journal rows commit.
    wake: Arc<Wake>,
    /// `refund.succeeded`, written with the refund that succeeded.
    events: Announce<Refund>,
}

impl Refunds {
    pub fn new(db: &Database, wake: &Arc<Wake>) -> Refunds {
        Refunds {
            db: db.clone(),
            wake: wake.clone(),
            events: Announce::none(),
        }
    }

    /// These refunds, writing the `refund.succeeded` events `events` wants.
    pub fn announcing(mut self, events: Announce<Refund>) -> Self {
        self.events = events;
        self
    }

    fn succeeded(&self, refund: &Refund, at: DateTime<Utc>) -> Option<NewEvent> {
        self.events.event(EventType::RefundSucceeded, refund, at)
    }

    /// Makes `refund` once: this operation's refund if it has one, else the amount
    /// reserved against the order's charge and the refund's row, with `journal`'s entries,
    /// in one commit.
    pub async fn refund(
        &self,
        refund: &NewRefund<'_>,
        journal: impl FnOnce(&Refund) -> Vec<NewEntry>,
    ) -> Result<RefundOutcome, StoreError> {
        if let Some(found) = self
            .by_operation(refund.caller, refund.operation_key)
            .await?
        {
            return Ok(RefundOutcome::Existing(found));
        }
        let made = Refund {
            id: Uuid::now_v7(),
            order_id: refund.order_id.clone(),
            receipt_id: Uuid::nil(),
            amount: refund.amount,
            operation_key: refund.operation_key.to_owned(),
            caller: refund.caller.to_owned(),
            reason: refund.reason.map(str::to_owned),
            status: refund.status,
            provider_refund_id: None,
            created_at: Utc::now().trunc_subsecs(6),
        };
        let entries = journal(&made);
        let event = (made.status == RefundStatus::Succeeded)
            .then(|| self.succeeded(&made, made.created_at))
            .flatten();
        let mut pooled = self.db.acquire().await?;
        // The update comes first: on SQLite it takes the write lock at the transaction's
        // first statement (a read first would fail to upgrade under a concurrent writer).
        let inserted = on_conn!(pooled.conn(), c => {
            let mut tx = c.begin_write().await?;
            let reserved: Option<String> = sqlx::query_scalar(RESERVE)
                .bind(made.order_id.as_str())
                .bind(made.amount.minor())
                .bind(made.amount.currency().code())
                .fetch_optional(&mut *tx)
                .await?;
            if reserved.is_none() {
                tx.rollback().await?;
                None
            } else {
                let id = insert(Conn::from(&mut *tx), &made).await?;
                if id {
                    journal::insert_in(Conn::from(&mut *tx), &entries).await?;
                    webhooks::insert_some(Conn::from(&mut *tx), event.as_ref()).await?;
                    tx.commit().await?;
                    self.wake.committed(&entries);
                } else {
                    tx.rollback().await?;
                }
                Some(id)
            }
        });
        drop(pooled);
        match inserted {
            Some(true) => Ok(RefundOutcome::Created(
                self.by_operation(refund.caller, refund.operation_key)
                    .await?
                    .ok_or_else(|| StoreError::Corrupt("a committed refund vanished".into()))?,
            )),
            // Another run of this operation made it meanwhile.
            Some(false) => self
                .by_operation(refund.caller, refund.operation_key)
                .await?
                .map(RefundOutcome::Existing)
                .ok_or_else(|| StoreError::Corrupt("a conflicting refund vanished".into())),
            None => {
                if let Some(found) = self
                    .by_operation(refund.caller, refund.operation_key)
                    .await?
                {
                    return Ok(RefundOutcome::Existing(found));
                }
                Ok(match self.refunded(refund.order_id).await? {
                    Some(state) if state.charged.currency() == refund.amount.currency() => {
                        RefundOutcome::Exceeds(state)
                    }
                    _ => RefundOutcome::NotCharged,
                })
            }
        }
    }

    /// Records the payment provider's answer to a pending refund: succeeded (with its id,
    /// and `journal`'s entries in the same commit), or failed (its amount given back).
    pub async fn settle(
        &self,
        refund: &Refund,
        status: RefundStatus,
        provider_refund_id: Option<&str>,
        entries: &[NewEntry],
    ) -> Result<bool, StoreError> {
        let mut pooled = self.db.acquire().await?;
        on_conn!(pooled.conn(), c => {
            let mut tx = c.begin_write().await?;
            let moved = sqlx::query(SETTLE)
                .bind(&refund.operation_key)
                .bind(&refund.caller)
                .bind(status.as_str())
                .bind(provider_refund_id)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            if moved && status == RefundStatus::Failed {
                sqlx::query(RELEASE)
                    .bind(refund.order_id.as_str())
                    .bind(refund.amount.minor())
                    .execute(&mut *tx)
                    .await?;
            }
            if moved && status == RefundStatus::Succeeded {
                journal::insert_in(Conn::from(&mut *tx), entries).await?;
                let settled = Refund {
                    status,
                    provider_refund_id: provider_refund_id
                        .map(str::to_owned)
                        .or_else(|| refund.provider_refund_id.clone()),
                    ..refund.clone()
                };
                webhooks::insert_some(Conn::from(&mut *tx), self.succeeded(&settled, Utc::now()).as_ref())
                    .await?;
            }
            tx.commit().await?;
            if moved && status == RefundStatus::Succeeded {
                self.wake.committed(entries);
            }
            Ok(moved)
        })
    }

    /// The refund `caller`'s operation `operation_key` made, if any.
    pub async fn by_operation(
        &self,
        caller: &str,
        operation_key: &str,
    ) -> Result<Option<Refund>, StoreError> {
        let mut conn = self.db.acquire().await?;
        let row: Option<Stored> = on_conn!(conn.conn(), c => sqlx::query_as(BY_OPERATION)
            .bind(operation_key)
            .bind(caller)
            .fetch_optional(c)
            .await?);
        row.map(Stored::into_refund).transpose()
    }

    /// An order's refunds, oldest first.
    pub async fn of_order(&self, order: &OrderId) -> Result<Vec<Refund>, StoreError> {
        let mut conn = self.db.acquire().await?;
        let rows: Vec<Stored> = on_conn!(conn.conn(), c => sqlx::query_as(OF_ORDER)
            .bind(order.as_str())
            .fetch_all(c)
            .await?);
        rows.into_iter().map(Stored::into_refund).collect()
    }

    /// What `order` was charged and what of it is refunded (pending refunds included);
    /// `None` when it has no receipt.
    pub async fn refunded(&self, order: &OrderId) -> Result<Option<Refunded>, StoreError> {
        let mut conn = self.db.acquire().await?;
        let row: Option<(i64, i64, String)> = on_conn!(conn.conn(), c => sqlx::query_as(REFUNDED)
            .bind(order.as_str())
            .fetch_optional(c)
            .await?);
        let Some((charged, refunded, currency)) = row else {
            return Ok(None);
        };
        let corrupt = |what: String| StoreError::Corrupt(format!("receipt of {order}: {what}"));
        let currency = Currency::parse(&currency).map_err(|e| corrupt(e.to_string()))?;
        Ok(Some(Refunded {
            charged: Money::from_minor(charged, currency).map_err(|e| corrupt(e.to_string()))?,
            refunded_minor: refunded,
        }))
    }
}

/// Inserts the refund's row (the receipt's id and currency read in the same statement);
/// false when the operation had one already.
async fn insert(conn: Conn<'_>, refund: &Refund) -> Result<bool, StoreError> {
    let id: Option<String> = match conn {
        Conn::Postgres(c) => {
            sqlx::query_scalar(INSERT)
                .bind(refund.id)
                .bind(refund.order_id.as_str())
                .bind(refund.amount.minor())
                .bind(&refund.operation_key)
                .bind(&refund.caller)
                .bind(refund.reason.as_deref())
                .bind(refund.status.as_str())
                .bind(refund.created_at)
                .fetch_optional(c)
                .await?
        }
        Conn::Sqlite(c) => {
            sqlx::query_scalar(INSERT)
                .bind(refund.id.hyphenated().to_string())
                .bind(refund.order_id.as_str())
                .bind(refund.amount.minor())
                .bind(&refund.operation_key)
                .bind(&refund.caller)
                .bind(refund.reason.as_deref())
                .bind(refund.status.as_str())
                .bind(
                    refund
                        .created_at
                        .to_rfc3339_opts(SecondsFormat::Micros, true),
                )
                .fetch_optional(c)
                .await?
        }
    };
    Ok(id.is_some())
}

#[derive(sqlx::FromRow)]
struct Stored {
    id: String,
    order_id: String,
    receipt_id: String,
    amount_minor: i64,
    currency: String,
    operation_key: String,
    caller: String,
    reason: Option<String>,
    status: String,
    provider_refund_id: Option<String>,
    created_at: DateTime<Utc>,
}

impl Stored {
    fn into_refund(self) -> Result<Refund, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt(format!("refund {}: {what}", self.id));
        let uuid = |text: &str| Uuid::parse_str(text).map_err(|e| corrupt(e.to_string()));
        let currency = Currency::parse(&self.currency).map_err(|e| corrupt(e.to_string()))?;
        Ok(Refund {
            id: uuid(&self.id)?,
            receipt_id: uuid(&self.receipt_id)?,
            order_id: OrderId::parse(&self.order_id).map_err(|e| corrupt(e.to_string()))?,
            amount: Money::from_minor(self.amount_minor, currency)
                .map_err(|e| corrupt(e.to_string()))?,
            status: RefundStatus::parse(&self.status)
                .ok_or_else(|| corrupt(format!("status {:?}", self.status)))?,
            operation_key: self.operation_key,
            caller: self.caller,
            reason: self.reason,
            provider_refund_id: self.provider_refund_id,
            created_at: self.created_at,
        })
    }
}
