//! The `budgets` table: what each caller was charged per currency per UTC day. A charge
//! of a caller with a budget reserves its amount here, in the transaction that records the
//! charge (the receipt, or the provider's intent); without a budget nothing here is read
//! or written. Every statement is one text for both databases; the day is the database's.
//!
//! A reservation that takes the day's spend across 80 or 100 % of the budget writes a
//! `budget.threshold` event in the same transaction, once per caller, currency, day and
//! threshold: the primary key of `budget_thresholds` settles which transaction writes it.

use std::fmt;

use chrono::Utc;

use crate::db::{Conn, StoreError, on_conn};
use crate::payments::money::{Money, decimal_minor};
use crate::webhooks::{self, Announce, EventType};

/// Adds the amount to the caller's day, if the sum stays within the limit. On Postgres the
/// `DO UPDATE … WHERE` is evaluated on the row's latest version under its lock, so two
/// instances racing for the last of a budget cannot both pass it; SQLite has one writer.
/// (`WHERE $3 <= $4`: a first charge over the whole budget inserts nothing, and SQLite
/// needs a `WHERE` before `ON CONFLICT` anyway.)
const RESERVE: &str = "\
    INSERT INTO budgets (caller, currency, day, spent_minor) \
    SELECT $1, $2, now_ms / 86400000, $3 FROM clock WHERE $3 <= $4 \
    ON CONFLICT (caller, currency, day) DO UPDATE \
    SET spent_minor = budgets.spent_minor + excluded.spent_minor \
    WHERE budgets.spent_minor + excluded.spent_minor <= $4 \
    RETURNING day, spent_minor";

/// The threshold crossed, if no transaction recorded it before: `$5` its event's id.
const CROSSED: &str = "\
    INSERT INTO budget_thresholds (caller, currency, day, threshold, event_id) \
    VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING";

/// The shares of a budget, in per cent, whose crossing is announced.
pub const THRESHOLDS: [u8; 2] = [80, 100];

/// A caller's day crossing a share of its budget: what `budget.threshold` announces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crossing {
    pub caller: String,
    /// Days since 1970-01-01, UTC, by the database's clock.
    pub day: i64,
    /// Per cent of the budget: one of [`THRESHOLDS`].
    pub threshold: u8,
    /// The day's budget.
    pub budget: Money,
    /// What the day's charges came to with the one that crossed.
    pub spent: Money,
}

impl Crossing {
    /// The thresholds a day's spend crosses going from `before` to `after` minor units of
    /// `limit`: reaching a threshold is crossing it.
    pub fn thresholds(before: i64, after: i64, limit: i64) -> impl Iterator<Item = u8> {
        let reached =
            move |spent: i64, t: u8| i128::from(spent) * 100 >= i128::from(t) * i128::from(limit);
        THRESHOLDS
            .into_iter()
            .filter(move |t| !reached(before, *t) && reached(after, *t))
    }
}

const SPENT: &str = "\
    SELECT spent_minor FROM budgets \
    WHERE caller = $1 AND currency = $2 AND day = (SELECT now_ms / 86400000 FROM clock)";

/// Gives an amount back to the day it was reserved on (a provider's attempt that ended
/// without charging).
const RELEASE: &str = "\
    UPDATE budgets SET spent_minor = spent_minor - $4 \
    WHERE caller = $1 AND currency = $2 AND day = $3 AND spent_minor >= $4";

/// What a reservation came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// Reserved on this day (days since 1970-01-01, UTC, by the database's clock).
    Reserved { day: i64 },
    /// The amount would pass the limit: nothing was reserved.
    Refused(BudgetLeft),
}

/// What is left of a caller's budget today.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetLeft {
    /// Minor units left (0 or more).
    pub minor: i64,
    /// The day's budget.
    pub limit: Money,
}

impl BudgetLeft {
    /// What is left, as a decimal in the budget's currency: `20.00`.
    pub fn decimal(&self) -> String {
        decimal_minor(self.minor, self.limit.currency())
    }
}

/// `20.00 USD of 100.00 USD`.
impl fmt::Display for BudgetLeft {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} of {}",
            self.decimal(),
            self.limit.currency(),
            self.limit
        )
    }
}

/// Reserves `amount` of `caller`'s budget `limit` for today, on `conn` (the transaction
/// that records the charge: rolled back, it reserves nothing), with the `budget.threshold`
/// events `events` wants of the thresholds it crosses.
pub async fn reserve(
    conn: Conn<'_>,
    caller: &str,
    amount: Money,
    limit: Money,
    events: &Announce<Crossing>,
) -> Result<Reservation, StoreError> {
    let currency = amount.currency().code();
    let mut conn = conn;
    let reserved: Option<(i64, i64)> = on_conn!(conn.reborrow(), c => sqlx::query_as(RESERVE)
        .bind(caller)
        .bind(currency)
        .bind(amount.minor())
        .bind(limit.minor())
        .fetch_optional(c)
        .await?);
    let Some((day, spent)) = reserved else {
        return refused(conn, caller, limit).await;
    };
    if events.wants(EventType::BudgetThreshold) {
        for threshold in Crossing::thresholds(spent - amount.minor(), spent, limit.minor()) {
            let crossing = Crossing {
                caller: caller.to_owned(),
                day,
                threshold,
                budget: limit,
                spent: Money::from_minor(spent, limit.currency())
                    .map_err(|e| StoreError::Corrupt(format!("budget of {caller}: {e}")))?,
            };
            announce(conn.reborrow(), events, &crossing).await?;
        }
    }
    Ok(Reservation::Reserved { day })
}

/// Records `crossing` and writes its event, unless another transaction recorded it first.
async fn announce(
    mut conn: Conn<'_>,
    events: &Announce<Crossing>,
    crossing: &Crossing,
) -> Result<(), StoreError> {
    let Some(event) = events.event(EventType::BudgetThreshold, crossing, Utc::now()) else {
        return Ok(());
    };
    let recorded = on_conn!(conn.reborrow(), c => sqlx::query(CROSSED)
        .bind(&crossing.caller)
        .bind(crossing.budget.currency().code())
        .bind(crossing.day)
        .bind(i64::from(crossing.threshold))
        .bind(&event.id)
        .execute(c)
        .await?
        .rows_affected());
    if recorded == 1 {
        webhooks::insert(conn, &event).await?;
    }
    Ok(())
}

async fn refused(conn: Conn<'_>, caller: &str, limit: Money) -> Result<Reservation, StoreError> {
    let spent = spent(conn, caller, limit).await?;
    Ok(Reservation::Refused(BudgetLeft {
        minor: (limit.minor() - spent).max(0),
        limit,
    }))
}

/// What `caller` was charged today in the currency of `limit`, in minor units.
pub async fn spent(conn: Conn<'_>, caller: &str, limit: Money) -> Result<i64, StoreError> {
    let spent: Option<i64> = on_conn!(conn, c => sqlx::query_scalar(SPENT)
        .bind(caller)
        .bind(limit.currency().code())
        .fetch_optional(c)
        .await?);
    Ok(spent.unwrap_or(0))
}

/// Gives `amount` back to `caller`'s `day`.
pub async fn release(
    conn: Conn<'_>,
    caller: &str,
    amount: Money,
    day: i64,
) -> Result<(), StoreError> {
    on_conn!(conn, c => sqlx::query(RELEASE)
        .bind(caller)
        .bind(amount.currency().code())
        .bind(day)
        .bind(amount.minor())
        .execute(c)
        .await
        .map(drop)?);
    Ok(())
}
