//! The `payment_intents` table: a charge through a payment provider, committed before the
//! provider is called, and settled with what the provider answered. One row per attempt
//! of an order; the unique (order_id, attempt) settles two instances racing to start one.
//! Every statement is one text for both databases.

use super::super::keys::OrderId;
use super::super::money::{Currency, Money};
use super::budgets::{self, BudgetLeft, Crossing, Reservation};
use crate::db::{BeginWrite, Conn, Database, StoreError, on_conn};
use crate::webhooks::Announce;

/// What an attempt is waiting for, or how it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntentStatus {
    /// Committed, sent or about to be; the provider's outcome is not recorded yet.
    Pending,
    /// The provider charged it (the receipt commits first).
    Succeeded,
    /// The provider declined it: the attempt is over.
    Declined,
    /// The provider waits for the customer (3-D Secure); settled again on the next run.
    RequiresAction,
    /// Beyond the provider's key retention, a look-up found no payment: nothing was
    /// charged under this attempt, and it is over.
    Absent,
}

impl IntentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            IntentStatus::Pending => "pending",
            IntentStatus::Succeeded => "succeeded",
            IntentStatus::Declined => "declined",
            IntentStatus::RequiresAction => "requires_action",
            IntentStatus::Absent => "absent",
        }
    }

    fn parse(text: &str) -> Result<IntentStatus, StoreError> {
        Ok(match text {
            "pending" => IntentStatus::Pending,
            "succeeded" => IntentStatus::Succeeded,
            "declined" => IntentStatus::Declined,
            "requires_action" => IntentStatus::RequiresAction,
            "absent" => IntentStatus::Absent,
            other => {
                return Err(StoreError::Corrupt(format!("intent status {other:?}")));
            }
        })
    }

    /// The provider may still hold (or make) a payment under this attempt's key: it is
    /// settled, never replaced by a new attempt.
    pub fn is_open(self) -> bool {
        matches!(self, IntentStatus::Pending | IntentStatus::RequiresAction)
    }
}

/// One attempt, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    pub order_id: String,
    pub attempt: i64,
    pub amount_minor: i64,
    pub currency: String,
    pub payment_method: String,
    /// The Idempotency-Key the provider gets: the charge key and the attempt.
    pub provider_key: String,
    pub operation_key: String,
    pub caller: String,
    pub status: IntentStatus,
    pub provider_payment_id: Option<String>,
    pub decline_code: Option<String>,
    /// How long ago it was committed, by the database's clock.
    pub age_ms: i64,
    /// The day its amount was reserved from its caller's budget on; `None`: no budget.
    pub budget_day: Option<i64>,
}

impl Intent {
    /// The provider key of an order's attempt.
    pub fn provider_key(order_id: &str, attempt: i64) -> String {
        format!("checkout:{order_id}:attempt:{attempt}")
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    order_id: String,
    attempt: i64,
    amount_minor: i64,
    currency: String,
    payment_method: String,
    provider_key: String,
    operation_key: String,
    caller: String,
    status: String,
    provider_payment_id: Option<String>,
    decline_code: Option<String>,
    age_ms: i64,
    budget_day: Option<i64>,
}

impl Row {
    fn into_intent(self) -> Result<Intent, StoreError> {
        Ok(Intent {
            status: IntentStatus::parse(&self.status)?,
            order_id: self.order_id,
            attempt: self.attempt,
            amount_minor: self.amount_minor,
            currency: self.currency,
            payment_method: self.payment_method,
            provider_key: self.provider_key,
            operation_key: self.operation_key,
            caller: self.caller,
            provider_payment_id: self.provider_payment_id,
            decline_code: self.decline_code,
            age_ms: self.age_ms,
            budget_day: self.budget_day,
        })
    }
}

const LATEST: &str = "\
    SELECT order_id, attempt, amount_minor, currency, payment_method, provider_key, \
    operation_key, caller, status, provider_payment_id, decline_code, \
    CAST((SELECT now_ms FROM clock) - created_ms AS BIGINT) AS age_ms, budget_day \
    FROM payment_intents WHERE order_id = $1 ORDER BY attempt DESC LIMIT 1";

/// (`WHERE true`: SQLite reads `ON CONFLICT` after a bare `FROM` as a join constraint.)
const CREATE: &str = "\
    INSERT INTO payment_intents (order_id, attempt, amount_minor, currency, payment_method, \
    provider_key, operation_key, caller, status, created_ms, budget_day) \
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, 'pending', now_ms, $9 FROM clock WHERE true \
    ON CONFLICT (order_id, attempt) DO NOTHING";

const SETTLE: &str = "\
    UPDATE payment_intents SET status = $3, \
    provider_payment_id = COALESCE($4, provider_payment_id), decline_code = $5 \
    WHERE order_id = $1 AND attempt = $2 AND status IN ('pending', 'requires_action')";

/// A budget's day is its own first: a new attempt (nothing reserved yet) has none.
const SET_BUDGET_DAY: &str =
    "UPDATE payment_intents SET budget_day = $3 WHERE order_id = $1 AND attempt = $2";

/// The payment provider's attempts, in the service's database.
#[derive(Clone, Debug)]
pub struct Intents {
    db: Database,
    /// `budget.threshold`, written with the attempt whose reservation crossed it.
    budgets: Announce<Crossing>,
}

impl Intents {
    pub fn new(db: &Database) -> Intents {
        Intents {
            db: db.clone(),
            budgets: Announce::none(),
        }
    }

    /// These intents, writing the `budget.threshold` events `budgets` wants with the
    /// attempts that cross a threshold.
    pub fn announcing(mut self, budgets: Announce<Crossing>) -> Self {
        self.budgets = budgets;
        self
    }

    /// The order's latest attempt.
    pub async fn latest(&self, order: &OrderId) -> Result<Option<Intent>, StoreError> {
        let mut conn = self.db.acquire().await?;
        latest(conn.conn(), order.as_str()).await
    }

    /// Commits a new attempt, before the provider is called; false when another run
    /// committed this attempt first.
    pub async fn create(&self, intent: &Intent) -> Result<bool, StoreError> {
        let mut conn = self.db.acquire().await?;
        create(conn.conn(), intent).await
    }

    /// [`Self::create`] for a caller with a budget: the attempt and its amount reserved
    /// from the budget `limit` in one transaction; over it, nothing written. An attempt
    /// another run committed first reserves nothing (it reserved its own).
    pub async fn create_within(
        &self,
        intent: &mut Intent,
        limit: Money,
    ) -> Result<Result<bool, BudgetLeft>, StoreError> {
        let amount = intent_amount(intent)?;
        let mut pooled = self.db.acquire().await?;
        on_conn!(pooled.conn(), c => {
            let mut tx = c.begin_write().await?;
            if !create(Conn::from(&mut *tx), &*intent).await? {
                tx.rollback().await?;
                return Ok(Ok(false));
            }
            match budgets::reserve(
                Conn::from(&mut *tx),
                &intent.caller,
                amount,
                limit,
                &self.budgets,
            )
            .await? {
                Reservation::Reserved { day } => {
                    sqlx::query(SET_BUDGET_DAY)
                        .bind(&intent.order_id)
                        .bind(intent.attempt)
                        .bind(day)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    intent.budget_day = Some(day);
                    Ok(Ok(true))
                }
                Reservation::Refused(left) => {
                    tx.rollback().await?;
                    Ok(Err(left))
                }
            }
        })
    }

    /// Records what the provider answered for an open attempt. One that ended without a
    /// charge (declined, absent) gives back what it reserved of its caller's budget, in
    /// the same transaction.
    pub async fn settle(
        &self,
        intent: &Intent,
        status: IntentStatus,
        payment_id: Option<&str>,
        decline_code: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut conn = self.db.acquire().await?;
        let gives_back = matches!(status, IntentStatus::Declined | IntentStatus::Absent);
        let Some(day) = intent.budget_day.filter(|_| gives_back) else {
            settle(conn.conn(), intent, status, payment_id, decline_code).await?;
            return Ok(());
        };
        let amount = intent_amount(intent)?;
        on_conn!(conn.conn(), c => {
            let mut tx = c.begin_write().await?;
            // Only the run that ends the attempt gives its amount back.
            if settle(Conn::from(&mut *tx), intent, status, payment_id, decline_code).await? {
                budgets::release(Conn::from(&mut *tx), &intent.caller, amount, day).await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }
}

fn intent_amount(intent: &Intent) -> Result<Money, StoreError> {
    let corrupt = |e: String| StoreError::Corrupt(format!("intent {}: {e}", intent.provider_key));
    let currency = Currency::parse(&intent.currency).map_err(|e| corrupt(e.to_string()))?;
    Money::from_minor(intent.amount_minor, currency).map_err(|e| corrupt(e.to_string()))
}

/// The order's latest attempt, if it has one.
async fn latest(conn: Conn<'_>, order_id: &str) -> Result<Option<Intent>, StoreError> {
    let row: Option<Row> = on_conn!(conn, c => sqlx::query_as(LATEST)
        .bind(order_id)
        .fetch_optional(c)
        .await?);
    row.map(Row::into_intent).transpose()
}

/// Commits `intent` as pending; false when the order already has this attempt (another
/// run started it first).
async fn create(conn: Conn<'_>, intent: &Intent) -> Result<bool, StoreError> {
    let made = on_conn!(conn, c => sqlx::query(CREATE)
        .bind(&intent.order_id)
        .bind(intent.attempt)
        .bind(intent.amount_minor)
        .bind(&intent.currency)
        .bind(&intent.payment_method)
        .bind(&intent.provider_key)
        .bind(&intent.operation_key)
        .bind(&intent.caller)
        .bind(intent.budget_day)
        .execute(c)
        .await?
        .rows_affected());
    Ok(made == 1)
}

/// Records an open attempt's outcome (an ended one keeps its own); false when it had
/// ended already.
async fn settle(
    conn: Conn<'_>,
    intent: &Intent,
    status: IntentStatus,
    payment_id: Option<&str>,
    decline_code: Option<&str>,
) -> Result<bool, StoreError> {
    let changed = on_conn!(conn, c => sqlx::query(SETTLE)
        .bind(&intent.order_id)
        .bind(intent.attempt)
        .bind(status.as_str())
        .bind(payment_id)
        .bind(decline_code)
        .execute(c)
        .await?
        .rows_affected());
    Ok(changed == 1)
}
