//! Receipts: one row per charged order, in Postgres or in SQLite.
//!
//! The unique `order_id` column is the charge key. A charge is a row of an
//! `INSERT … ON CONFLICT DO NOTHING RETURNING` (written with the charges that arrive with
//! it: [`group`]), then a read of the winner when the insert lost: the database, not Rust
//! code, decides which of two racing charges counts.

mod group;
mod postgres;
mod sqlite;

use std::future::Future;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use postgres::PgReceipts;
pub use sqlite::SqliteReceipts;

use super::keys::{ChargeKey, OperationKey, OrderId};
use super::money::{Currency, Money};
use crate::db::{Database, StoreError};

/// Proof that an order was charged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    pub id: Uuid,
    pub order_id: OrderId,
    pub amount: Money,
    /// The operation that made the charge (its `Idempotency-Key`, or the minted UUIDv7).
    pub operation_key: String,
    pub created_at: DateTime<Utc>,
}

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

/// The contract every receipts store keeps (the suite in `tests/store_contract.rs`).
pub trait ReceiptStore: Send + Sync {
    /// Charges `key`'s order once. Every later or concurrent call for the same order gets
    /// the first receipt back, or [`ChargeOutcome::AmountConflict`] for another amount.
    fn charge(
        &self,
        key: &ChargeKey,
        amount: Money,
        operation: &OperationKey,
    ) -> impl Future<Output = Result<ChargeOutcome, StoreError>> + Send;

    fn receipt(
        &self,
        order: &OrderId,
    ) -> impl Future<Output = Result<Option<Receipt>, StoreError>> + Send;
}

/// The store the running service uses: whichever database `DATABASE_URL` names.
#[derive(Clone, Debug)]
pub enum Receipts {
    Postgres(PgReceipts),
    Sqlite(SqliteReceipts),
}

impl Receipts {
    pub fn new(db: &Database) -> Receipts {
        match db {
            Database::Postgres(pool) => Receipts::Postgres(PgReceipts::new(pool.clone())),
            Database::Sqlite(sqlite) => Receipts::Sqlite(SqliteReceipts::new(sqlite.pool())),
        }
    }
}

impl ReceiptStore for Receipts {
    async fn charge(
        &self,
        key: &ChargeKey,
        amount: Money,
        operation: &OperationKey,
    ) -> Result<ChargeOutcome, StoreError> {
        match self {
            Receipts::Postgres(s) => s.charge(key, amount, operation).await,
            Receipts::Sqlite(s) => s.charge(key, amount, operation).await,
        }
    }

    async fn receipt(&self, order: &OrderId) -> Result<Option<Receipt>, StoreError> {
        match self {
            Receipts::Postgres(s) => s.receipt(order).await,
            Receipts::Sqlite(s) => s.receipt(order).await,
        }
    }
}

/// What a charge did: the receipt its insert returned, or, when the insert lost to an
/// earlier or concurrent charge, the winner's, read by `winner`. Under READ COMMITTED that
/// read is a new statement with a fresh snapshot, so it sees the winner's row even when the
/// winner committed while our insert was waiting on it.
async fn settle(
    inserted: Option<Receipt>,
    key: &ChargeKey,
    asked: Money,
    winner: impl Future<Output = Result<Option<Receipt>, StoreError>>,
) -> Result<ChargeOutcome, StoreError> {
    if let Some(receipt) = inserted {
        return Ok(ChargeOutcome::Created(receipt));
    }
    let existing = winner
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("receipt for {} vanished", key.order_id())))?;
    Ok(if existing.amount == asked {
        ChargeOutcome::Existing(existing)
    } else {
        ChargeOutcome::AmountConflict(existing)
    })
}

/// Builds a receipt from stored columns, refusing values no charge could have written.
fn receipt_from_columns(
    id: Uuid,
    order_id: &str,
    amount_minor: i64,
    currency: &str,
    operation_key: String,
    created_at: DateTime<Utc>,
) -> Result<Receipt, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("receipt {id}: {what}"));
    let currency = Currency::parse(currency).map_err(|e| corrupt(e.to_string()))?;
    Ok(Receipt {
        id,
        order_id: OrderId::parse(order_id).map_err(|e| corrupt(format!("order id {e}")))?,
        amount: Money::from_minor(amount_minor, currency)
            .map_err(|e| corrupt(format!("amount {e}")))?,
        operation_key,
        created_at,
    })
}
