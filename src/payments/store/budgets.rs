//! The `budgets` table: what each caller was charged per currency per UTC day. A charge
//! of a caller with a budget reserves its amount here, in the transaction that records the
//! charge (the receipt, or the provider's intent); without a budget nothing here is read
//! or written. Every statement is one text for both databases; the day is the database's.

use std::fmt;

use crate::db::{Conn, StoreError, on_conn};
use crate::payments::money::{Money, decimal_minor};

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
    RETURNING day";

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
/// that records the charge: rolled back, it reserves nothing).
pub async fn reserve(
    conn: Conn<'_>,
    caller: &str,
    amount: Money,
    limit: Money,
) -> Result<Reservation, StoreError> {
    let currency = amount.currency().code();
    Ok(match conn {
        Conn::Postgres(c) => {
            let day: Option<i64> = sqlx::query_scalar(RESERVE)
                .bind(caller)
                .bind(currency)
                .bind(amount.minor())
                .bind(limit.minor())
                .fetch_optional(&mut *c)
                .await?;
            match day {
                Some(day) => Reservation::Reserved { day },
                None => refused(Conn::Postgres(c), caller, limit).await?,
            }
        }
        Conn::Sqlite(c) => {
            let day: Option<i64> = sqlx::query_scalar(RESERVE)
                .bind(caller)
                .bind(currency)
                .bind(amount.minor())
                .bind(limit.minor())
                .fetch_optional(&mut *c)
                .await?;
            match day {
                Some(day) => Reservation::Reserved { day },
                None => refused(Conn::Sqlite(c), caller, limit).await?,
            }
        }
    })
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
