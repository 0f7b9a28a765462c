use super::keys::{ChargeKey, OperationKey, OrderId};
use super::money::Money;
use super::store::{ChargeOutcome, Receipt, Receipts};
use crate::db::StoreError;
use crate::journal::NewEntry;

/// Takes payments. `charge` cannot be called without a [`ChargeKey`], and only a validated
/// [`super::Order`] makes one: the exactly-once contract is in the signature.
#[derive(Clone, Debug)]
pub struct PaymentGateway {
    store: Receipts,
}

/// A charge that went through, now or earlier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charged {
    pub receipt: Receipt,
    /// True when this call made the receipt; false when it found the earlier one.
    pub created: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error("order {} was already charged {}, not {asked}", .existing.order_id, .existing.amount)]
    AmountConflict { existing: Receipt, asked: Money },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ChargeError {
    /// This call provably charged nothing: the order is charged another amount, or the
    /// statement never reached the database.
    pub fn charged_nothing(&self) -> bool {
        match self {
            ChargeError::AmountConflict { .. } => true,
            ChargeError::Store(err) => err.never_sent(),
        }
    }
}

impl PaymentGateway {
    pub fn new(store: Receipts) -> Self {
        PaymentGateway { store }
    }

    /// Charges the key's order `amount`, once. Calling it again for the same order and
    /// amount returns the first receipt; another amount is refused and changes nothing.
    pub async fn charge(
        &self,
        key: &ChargeKey,
        amount: Money,
        operation: &OperationKey,
    ) -> Result<Charged, ChargeError> {
        self.charge_journaled(key, amount, operation, "", |_| Vec::new())
            .await
    }

    /// [`Self::charge`] for `caller`'s operation, committing `journal`'s entries with the
    /// receipt when this call makes it: the assistant's record of the charge's tool result.
    pub async fn charge_journaled(
        &self,
        key: &ChargeKey,
        amount: Money,
        operation: &OperationKey,
        caller: &str,
        journal: impl FnOnce(&Receipt) -> Vec<NewEntry>,
    ) -> Result<Charged, ChargeError> {
        match self
            .store
            .charge_journaled(key, amount, operation, caller, journal)
            .await?
        {
            ChargeOutcome::Created(receipt) => Ok(Charged {
                receipt,
                created: true,
            }),
            ChargeOutcome::Existing(receipt) => Ok(Charged {
                receipt,
                created: false,
            }),
            ChargeOutcome::AmountConflict(existing) => Err(ChargeError::AmountConflict {
                existing,
                asked: amount,
            }),
        }
    }

    pub async fn receipt(&self, order: &OrderId) -> Result<Option<Receipt>, StoreError> {
        self.store.receipt(order).await
    }
}
