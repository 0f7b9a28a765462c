//! Charges waiting for a person (docs/approvals.md): their metrics' definitions, in the
//! catalogue of `metrics.rs`, and the methods that record them.

use super::{Def, Metrics};

/// How a decision can go: one series each.
const DECISIONS: [&str; 3] = ["approved", "denied", "expired"];

pub(super) const PENDING: Def = Def {
    name: "checkout_approvals_pending",
    help: "Approvals waiting for a person's decision now, across every instance (the database's count, read by this instance's expiry sweep every second).",
    buckets: None,
};
pub(super) const DECIDED: Def = Def {
    name: "checkout_approval_decisions_total",
    help: "Approvals decided by this instance, by outcome: approved, denied (POST /approvals/{id}/approve or /deny, the first decision), expired (nobody decided before CHECKOUT_APPROVAL_TTL_SECS). A repeated decision is not counted again.",
    buckets: None,
};
pub(super) const ASKED: Def = Def {
    name: "checkout_approvals_requested_total",
    help: "Checkouts paused for a person's approval by this instance (the amount above CHECKOUT_APPROVAL_ABOVE or the API key's own threshold): answered 202 requires_approval.",
    buckets: None,
};

impl Metrics {
    /// Every series at zero, so that a rate over them exists before the first event.
    pub(super) fn approvals_start(&self) {
        for outcome in DECISIONS {
            self.counter(&DECIDED, &[("outcome", outcome)], 0);
        }
        self.counter(&ASKED, &[], 0);
        self.approvals_pending(0);
    }

    /// A checkout paused for an approval.
    pub fn approval_requested(&self) {
        self.counter(&ASKED, &[], 1);
    }

    /// An approval was decided: `approved`, `denied` or `expired`.
    pub fn approval_decided(&self, outcome: &'static str) {
        debug_assert!(DECISIONS.contains(&outcome), "{outcome}");
        self.counter(&DECIDED, &[("outcome", outcome)], 1);
    }

    /// Approvals pending now, as the database counts them.
    pub fn approvals_pending(&self, pending: i64) {
        self.gauge(&PENDING).set(pending as f64);
    }
}
