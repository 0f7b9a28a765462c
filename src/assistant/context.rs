use std::sync::{Arc, Mutex};

use crate::payments::{ChargeKey, OperationKey, Order, Receipt};

/// Everything one checkout carries through every retried unit: the order the client
/// authorized and the keys the handler made for it before anything was retried.
///
/// Cloning is cheap and every clone is the same checkout: the tower retry layers clone it
/// for each attempt, so attempt three charges with the very keys attempt one had.
#[derive(Clone, Debug)]
pub struct CheckoutContext(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    order: Order,
    charge_key: ChargeKey,
    operation_key: OperationKey,
    /// What the attempts learned about the charge: what an error answer reports.
    charge: Mutex<ChargeState>,
}

#[derive(Debug, Default)]
struct ChargeState {
    receipt: Option<Receipt>,
    /// A charge statement may have reached the database without its answer reaching us
    /// (a timeout cut it off, the connection broke).
    in_doubt: bool,
}

impl CheckoutContext {
    /// Made by the HTTP handler, from the validated order, before the loop starts.
    pub fn new(order: Order, operation_key: OperationKey) -> Self {
        CheckoutContext(Arc::new(Inner {
            charge_key: order.charge_key(),
            order,
            operation_key,
            charge: Mutex::new(ChargeState::default()),
        }))
    }

    pub fn order(&self) -> &Order {
        &self.0.order
    }

    pub fn charge_key(&self) -> &ChargeKey {
        &self.0.charge_key
    }

    pub fn operation_key(&self) -> &OperationKey {
        &self.0.operation_key
    }

    fn charge_state(&self) -> std::sync::MutexGuard<'_, ChargeState> {
        self.0.charge.lock().expect("never poisoned")
    }

    /// Called before a charge statement is sent: until it answers, its outcome is unknown.
    /// Returns the doubt there was before, for [`Self::charge_not_sent`].
    pub(crate) fn charge_sending(&self) -> bool {
        std::mem::replace(&mut self.charge_state().in_doubt, true)
    }

    /// The statement provably never reached the database (no connection was had).
    pub(crate) fn charge_not_sent(&self, doubt_before: bool) {
        self.charge_state().in_doubt = doubt_before;
    }

    pub(crate) fn record_charge(&self, receipt: &Receipt) {
        let mut state = self.charge_state();
        state.receipt = Some(receipt.clone());
        state.in_doubt = false;
    }

    /// What this checkout knows of its charge, without asking the database: charged
    /// (with the receipt), not charged, or unknown (`None`).
    pub fn charge_known(&self) -> Option<Option<Receipt>> {
        let state = self.charge_state();
        match (&state.receipt, state.in_doubt) {
            (Some(receipt), _) => Some(Some(receipt.clone())),
            (None, false) => Some(None),
            (None, true) => None,
        }
    }
}

/// The value the loop retry clones: the checkout, and which attempt this is.
#[derive(Clone, Debug)]
pub struct LoopRequest {
    pub ctx: CheckoutContext,
    /// 1 for the first run of the loop, 2 for the first loop retry, …
    pub attempt: u32,
}
