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
    /// The receipt any attempt got from the gateway: what an error answer reports.
    charged: Mutex<Option<Receipt>>,
}

impl CheckoutContext {
    /// Made by the HTTP handler, from the validated order, before the loop starts.
    pub fn new(order: Order, operation_key: OperationKey) -> Self {
        CheckoutContext(Arc::new(Inner {
            charge_key: order.charge_key(),
            order,
            operation_key,
            charged: Mutex::new(None),
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

    pub(crate) fn record_charge(&self, receipt: &Receipt) {
        *self.0.charged.lock().expect("never poisoned") = Some(receipt.clone());
    }

    /// The receipt this checkout's charge returned, in any attempt so far.
    pub fn charged(&self) -> Option<Receipt> {
        self.0.charged.lock().expect("never poisoned").clone()
    }
}

/// The value the loop retry clones: the checkout, and which attempt this is.
#[derive(Clone, Debug)]
pub struct LoopRequest {
    pub ctx: CheckoutContext,
    /// 1 for the first run of the loop, 2 for the first loop retry, …
    pub attempt: u32,
}
