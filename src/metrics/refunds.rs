//! Money back (docs/refunds.md): the refunds' metrics' definitions, in the catalogue of
//! `metrics.rs`, and the methods that record them.

use super::{Def, Metrics};

/// How a refund tool call can end: one series each.
const OUTCOMES: [&str; 3] = ["refunded", "found", "refused"];

pub(super) const REFUNDS: Def = Def {
    name: "checkout_refunds_total",
    help: "Refund tool calls by outcome: refunded (this call made the refund), found (the operation's refund was made before: a retry or a resume), refused (it would pass what the order was charged, or the order is not charged; nothing refunded).",
    buckets: None,
};
pub(super) const REFUND_OPERATIONS: Def = Def {
    name: "checkout_refund_operations_total",
    help: "Refunds answered (POST /refunds, and their resumes), by outcome: code=\"ok\" for a confirmed refund (made now or found), else the problem code; invalid_request counts refunds refused by validation. A replayed Idempotency-Key answer is not counted here, and no refund is counted in checkout_checkouts_total.",
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

    /// A refund operation answered: `ok` (a confirmed refund), or its problem's code.
    pub fn refund_answered(&self, code: &'static str) {
        self.counter(&REFUND_OPERATIONS, &[("code", code)], 1);
    }

    /// A refund made (`refunded`: `minor` units of `currency` given back) or found
    /// (`found`).
    pub fn refund(&self, outcome: &'static str, currency: &str, minor: u64) {
        debug_assert!(OUTCOMES.contains(&outcome), "{outcome}");
        self.counter(&REFUNDS, &[("outcome", outcome)], 1);
        if outcome == "refunded" {
            self.refunded(currency, minor);
        }
    }

    /// Money given back, by currency, in minor units.
    pub fn refunded(&self, currency: &str, minor: u64) {
        self.counter(&REFUNDED, &[("currency", currency)], minor);
    }

    /// A refund refused: nothing refunded.
    pub fn refund_refused(&self) {
        self.counter(&REFUNDS, &[("outcome", "refused")], 1);
    }
}
