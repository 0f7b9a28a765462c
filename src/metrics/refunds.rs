//! Money back (docs/refunds.md): the refunds' metrics' definitions, in the catalogue of
//! `metrics.rs`, and the methods that record them.

use super::{Def, Metrics};
use crate::payments::Money;
use crate::payments::store::Refund;

/// How a refund tool call can end: one series each.
const OUTCOMES: [&str; 3] = ["refunded", "found", "refused"];

pub(super) const REFUNDS: Def = Def {
    name: "checkout_refunds_total",
    help: "Refund tool calls by outcome: refunded (this call made the refund), found (the operation's refund was made before: a retry or a resume), refused (it would pass what the order was charged, or the order is not charged; nothing refunded).",
    buckets: None,
};
pub(super) const REFUNDED: Def = Def {
    name: "checkout_refunded_minor_total",
    help: "Amount refunded by this instance's refunds, in minor units of the currency (cents for USD), by currency.",
    buckets: None,
};

impl Metrics {
    /// Every outcome at zero, so that a rate over them exists before the first refund.
    pub(super) fn refunds_start(&self) {
        for outcome in OUTCOMES {
            self.counter(&REFUNDS, &[("outcome", outcome)], 0);
        }
    }

    /// A refund made (`refunded`) or found (`found`).
    pub fn refund(&self, outcome: &'static str, refund: &Refund) {
        debug_assert!(OUTCOMES.contains(&outcome), "{outcome}");
        self.counter(&REFUNDS, &[("outcome", outcome)], 1);
        if outcome == "refunded" {
            self.refunded(refund.amount);
        }
    }

    /// Money given back, by currency.
    pub fn refunded(&self, amount: Money) {
        let minor = u64::try_from(amount.minor()).unwrap_or(0);
        self.counter(&REFUNDED, &[("currency", amount.currency().code())], minor);
    }

    /// A refund refused: nothing refunded.
    pub fn refund_refused(&self) {
        self.counter(&REFUNDS, &[("outcome", "refused")], 1);
    }
}
