//! Receipts: one row per charged order, in whichever database the service uses. With a
//! payment provider, its attempts are the intents of `intents.rs`, a store of their own.
//!
//! A charge is a row of an `INSERT … ON CONFLICT DO NOTHING RETURNING` (written with the
//! charges that arrive with it, by a group writer), then a read of the winner when the
//! insert lost: the database, not Rust code, decides which of two racing charges counts.

pub mod budgets;
pub mod intents;
pub mod receipts;
pub mod refunds;

pub use budgets::BudgetLeft;
pub use intents::{Intent, IntentStatus, Intents};
pub use receipts::Receipt;
pub use refunds::{NewRefund, Refund, RefundOutcome, RefundStatus, Refunded, Refunds};

use std::sync::Arc;

use chrono::{SubsecRound, Utc};
use uuid::Uuid;

use super::keys::{Charge, OrderId};
use crate::db::{BeginWrite, Conn, Database, GroupWriter, StoreError, on_conn};
use crate::journal::NewEntry;
use crate::journal::wake::Wake;
use crate::payments::money::Money;
use crate::webhooks::{Announce, EventType};
use budgets::Reservation;
use receipts::{ChargeRow, Charges};

/// What a charge did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// This call charged the order.
    Created(Receipt),
    /// The order was already charged for this amount; nothing changed.
    Existing(Receipt),
    /// The order was already charged for another amount; nothing changed.
    AmountConflict(Receipt),
    /// The charge would pass its caller's budget for the day: nothing was written.
    OverBudget(BudgetLeft),
}

/// The receipts of the service's database, with the task that commits charges in groups
/// (it ends when the last clone is dropped). The contract is `tests/spec/store_contract.rs`.
#[derive(Clone, Debug)]
pub struct Receipts {
    db: Database,
    writer: GroupWriter<Charges>,
    /// The streams to tell when a charge's or a refund's journal rows commit.
    wake: Arc<Wake>,
    /// `charge.succeeded`, written with the receipt.
    charges: Announce<Receipt>,
    /// `refund.succeeded`, written with the refund (see [`Refunds`]).
    refunds: Announce<Refund>,
    /// `budget.threshold`, written with the charge whose reservation crossed it.
    budgets: Announce<budgets::Crossing>,
}

impl Receipts {
    pub fn new(db: &Database, wake: &Arc<Wake>) -> Receipts {
        Receipts {
            db: db.clone(),
            writer: GroupWriter::start(db, Charges(wake.clone())),
            wake: wake.clone(),
            charges: Announce::none(),
            refunds: Announce::none(),
            budgets: Announce::none(),
        }
    }

    /// These receipts, writing the events `charges` and `refunds` want with the facts.
    pub fn announcing(mut self, charges: Announce<Receipt>, refunds: Announce<Refund>) -> Self {
        self.charges = charges;
        self.refunds = refunds;
        self
    }

    /// These receipts, writing the `budget.threshold` events `budgets` wants with the
    /// charges that cross a threshold.
    pub fn announcing_budgets(mut self, budgets: Announce<budgets::Crossing>) -> Self {
        self.budgets = budgets;
        self
    }

    /// Makes `charge` once. Every later or concurrent charge of the same order gets the
    /// first receipt back, or [`ChargeOutcome::AmountConflict`] for another amount.
    ///
    /// `journal` gives the journal entries that commit with the receipt when this call
    /// makes it (in the same statement or transaction): a resumed loop then finds the
    /// charge's tool result whenever it finds the charge. With a payment provider,
    /// `provider_payment_id` is the provider's id of the charge.
    pub async fn charge(
        &self,
        charge: &Charge<'_>,
        provider_payment_id: Option<&str>,
        journal: impl FnOnce(&Receipt) -> Vec<NewEntry>,
    ) -> Result<ChargeOutcome, StoreError> {
        let order_id = charge.order_id();
        let amount = charge.amount();
        // Its id and time are chosen once, in Rust, so that both databases store the same
        // values (microseconds, as Postgres keeps them).
        let receipt = Receipt {
            id: Uuid::now_v7(),
            order_id: order_id.clone(),
            amount,
            operation_key: charge.operation().as_str().to_owned(),
            caller: charge.caller().to_owned(),
            created_at: Utc::now().trunc_subsecs(6),
            provider_payment_id: provider_payment_id.map(str::to_owned),
        };
        let entries = journal(&receipt);
        let event = self
            .charges
            .event(EventType::ChargeSucceeded, &receipt, receipt.created_at);
        let row = ChargeRow {
            receipt,
            entries,
            event,
        };
        // Only a charge with a budget takes the transaction; without one, the group
        // writer as ever. Boxed: its future stays out of every other charge's.
        let made = match charge.budget() {
            Some(limit) => match Box::pin(self.charge_within(row, limit)).await? {
                Ok(made) => made,
                Err(left) => return Ok(ChargeOutcome::OverBudget(left)),
            },
            None => self.writer.write(row).await?,
        };
        if let Some(receipt) = made {
            return Ok(ChargeOutcome::Created(receipt));
        }
        // The insert lost to an earlier or concurrent charge. Under READ COMMITTED this
        // read is a new statement with a fresh snapshot, so it sees the winner's row even
        // when the winner committed while our insert was waiting on it. Boxed: inline, the
        // statement's future would be in every charge's, and so in every loop's (figure 2).
        let existing = Box::pin(self.receipt(order_id))
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("receipt for {order_id} vanished")))?;
        Ok(if existing.amount == amount {
            ChargeOutcome::Existing(existing)
        } else {
            ChargeOutcome::AmountConflict(existing)
        })
    }

    /// The refunds of the same database.
    pub fn refunds(&self) -> Refunds {
        Refunds::new(&self.db, &self.wake).announcing(self.refunds.clone())
    }

    pub async fn receipt(&self, order: &OrderId) -> Result<Option<Receipt>, StoreError> {
        let mut conn = self.db.acquire().await?;
        receipts::find(conn.conn(), order).await
    }

    /// One transaction: the receipt (and its journal entries); if it went in (the order
    /// was not charged before: a retry reserves nothing again), the amount reserved from
    /// the caller's budget `limit`; over it, rolled back, nothing written. The receipt's
    /// row is locked before the budget's, in every transaction of every instance, so two
    /// of them cannot deadlock.
    async fn charge_within(
        &self,
        row: ChargeRow,
        limit: Money,
    ) -> Result<Result<Option<Receipt>, BudgetLeft>, StoreError> {
        let mut pooled = self.db.acquire().await?;
        on_conn!(pooled.conn(), c => {
            let mut tx = c.begin_write().await?;
            let made = receipts::insert(Conn::from(&mut *tx), std::slice::from_ref(&row))
                .await?
                .pop();
            let Some(receipt) = made else {
                tx.rollback().await?;
                return Ok(Ok(None));
            };
            let reserved = budgets::reserve(
                Conn::from(&mut *tx),
                &receipt.caller,
                receipt.amount,
                limit,
                &self.budgets,
            )
            .await?;
            match reserved {
                Reservation::Reserved { .. } => {
                    tx.commit().await?;
                    Ok(Ok(Some(receipt)))
                }
                Reservation::Refused(left) => {
                    tx.rollback().await?;
                    Ok(Err(left))
                }
            }
        })
    }
}
