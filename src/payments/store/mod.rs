//! Receipts: one row per charged order, in whichever database the service uses.
//!
//! A charge is a row of an `INSERT … ON CONFLICT DO NOTHING RETURNING` (written with the
//! charges that arrive with it, by a group writer), then a read of the winner when the
//! insert lost: the database, not Rust code, decides which of two racing charges counts.

pub mod intents;
pub mod receipts;

pub use intents::{Intent, IntentStatus};
pub use receipts::Receipt;

use chrono::{SubsecRound, Utc};
use uuid::Uuid;

use super::keys::{ChargeKey, OperationKey, OrderId};
use super::money::Money;
use crate::db::{Database, GroupWriter, StoreError};
use crate::journal::NewEntry;
use receipts::{ChargeRow, Charges, NewReceipt};

/// What a charge did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// This call charged the order.
    Created(Receipt),
    /// The order was already charged for this amount; nothing changed.
    Existing(Receipt),
    /// The order was already charged for another amount; nothing changed.
    AmountConflict(Receipt),
}

/// The receipts of the service's database, with the task that commits charges in groups
/// (it ends when the last clone is dropped). The contract is `tests/store_contract.rs`.
#[derive(Clone, Debug)]
pub struct Receipts {
    db: Database,
    writer: GroupWriter<Charges>,
}

impl Receipts {
    pub fn new(db: &Database) -> Receipts {
        Receipts {
            db: db.clone(),
            writer: GroupWriter::start(db, Charges),
        }
    }

    /// Charges `key`'s order once. Every later or concurrent call for the same order gets
    /// the first receipt back, or [`ChargeOutcome::AmountConflict`] for another amount.
    pub async fn charge(
        &self,
        key: &ChargeKey,
        amount: Money,
        operation: &OperationKey,
    ) -> Result<ChargeOutcome, StoreError> {
        self.charge_journaled(key, amount, operation, "", |_| Vec::new())
            .await
    }

    /// [`Self::charge`] for `caller`'s operation, where `journal` gives the journal entries
    /// that commit with the receipt when this call makes it (in the same statement or
    /// transaction): a resumed loop then finds the charge's tool result whenever it finds
    /// the charge.
    pub async fn charge_journaled(
        &self,
        key: &ChargeKey,
        amount: Money,
        operation: &OperationKey,
        caller: &str,
        journal: impl FnOnce(&Receipt) -> Vec<NewEntry>,
    ) -> Result<ChargeOutcome, StoreError> {
        self.record(key, amount, operation, caller, None, journal)
            .await
    }

    /// [`Self::charge_journaled`], recording the payment provider's id of the charge:
    /// the receipt of a charge the provider made.
    pub async fn record(
        &self,
        key: &ChargeKey,
        amount: Money,
        operation: &OperationKey,
        caller: &str,
        provider_payment_id: Option<&str>,
        journal: impl FnOnce(&Receipt) -> Vec<NewEntry>,
    ) -> Result<ChargeOutcome, StoreError> {
        let receipt = NewReceipt {
            id: Uuid::now_v7(),
            order_id: key.order_id().as_str().to_owned(),
            amount,
            operation_key: operation.as_str().to_owned(),
            caller: caller.to_owned(),
            created_at: Utc::now().trunc_subsecs(6),
            provider_payment_id: provider_payment_id.map(str::to_owned),
        };
        let entries = journal(&Receipt {
            id: receipt.id,
            order_id: key.order_id().clone(),
            amount,
            operation_key: receipt.operation_key.clone(),
            caller: receipt.caller.clone(),
            created_at: receipt.created_at,
            provider_payment_id: receipt.provider_payment_id.clone(),
        });
        if let Some(receipt) = self.writer.write(ChargeRow { receipt, entries }).await? {
            return Ok(ChargeOutcome::Created(receipt));
        }
        // The insert lost to an earlier or concurrent charge. Under READ COMMITTED this
        // read is a new statement with a fresh snapshot, so it sees the winner's row even
        // when the winner committed while our insert was waiting on it.
        let existing = self.receipt(key.order_id()).await?.ok_or_else(|| {
            StoreError::Corrupt(format!("receipt for {} vanished", key.order_id()))
        })?;
        Ok(if existing.amount == amount {
            ChargeOutcome::Existing(existing)
        } else {
            ChargeOutcome::AmountConflict(existing)
        })
    }

    pub async fn receipt(&self, order: &OrderId) -> Result<Option<Receipt>, StoreError> {
        let mut conn = self.db.acquire().await?;
        receipts::find(conn.conn(), order).await
    }

    /// The order's latest payment-provider attempt.
    pub async fn latest_intent(&self, order: &OrderId) -> Result<Option<Intent>, StoreError> {
        let mut conn = self.db.acquire().await?;
        intents::latest(conn.conn(), order.as_str()).await
    }

    /// Commits a new attempt, before the provider is called; false when another run
    /// committed this attempt first.
    pub async fn create_intent(&self, intent: &Intent) -> Result<bool, StoreError> {
        let mut conn = self.db.acquire().await?;
        intents::create(conn.conn(), intent).await
    }

    /// Records what the provider answered for an open attempt.
    pub async fn settle_intent(
        &self,
        intent: &Intent,
        status: IntentStatus,
        payment_id: Option<&str>,
        decline_code: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut conn = self.db.acquire().await?;
        intents::settle(conn.conn(), intent, status, payment_id, decline_code).await
    }
}
