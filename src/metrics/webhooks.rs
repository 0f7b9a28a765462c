//! Webhooks (docs/webhooks.md): the deliveries' metrics' definitions, in the catalogue of
//! `metrics.rs`, and the methods that record them.

use super::{Def, Metrics};

/// How one delivery attempt can end: one series each.
const OUTCOMES: [&str; 4] = ["delivered", "retried", "failed", "gone"];

pub(super) const DELIVERIES: Def = Def {
    name: "checkout_webhook_deliveries_total",
    help: "Webhook delivery attempts by this instance, by outcome: delivered (2xx), retried (any other answer, a timeout or no connection; due again on CHECKOUT_WEBHOOK_RETRY_SCHEDULE, or after Retry-After on 429/503), failed (the schedule's last retry failed: never sent again), gone (410: the endpoint is disabled).",
    buckets: None,
};
pub(super) const PENDING: Def = Def {
    name: "checkout_webhook_events_pending",
    help: "Webhook deliveries (one per event and endpoint that takes its type) not yet made nor given up, across every instance, a disabled endpoint's kept ones included (the database's count, read by this instance's deliverer).",
    buckets: None,
};
pub(super) const OLDEST: Def = Def {
    name: "checkout_webhook_oldest_pending_seconds",
    help: "Age of the oldest pending webhook delivery, in seconds (0 when none waits): it grows while an endpoint is down or disabled.",
    buckets: None,
};

impl Metrics {
    /// Every outcome at zero, so that a rate over them exists before the first event.
    pub(super) fn webhooks_start(&self) {
        for outcome in OUTCOMES {
            self.counter(&DELIVERIES, &[("outcome", outcome)], 0);
        }
        self.webhook_backlog(0, 0);
    }

    /// A delivery attempt ended: `delivered`, `retried`, `failed` or `gone`.
    pub fn webhook_delivery(&self, outcome: &'static str) {
        debug_assert!(OUTCOMES.contains(&outcome), "{outcome}");
        self.counter(&DELIVERIES, &[("outcome", outcome)], 1);
    }

    /// The deliveries waiting now, and the oldest's age in milliseconds.
    pub fn webhook_backlog(&self, pending: i64, oldest_age_ms: i64) {
        self.gauge(&PENDING).set(pending as f64);
        self.gauge(&OLDEST).set(oldest_age_ms as f64 / 1000.0);
    }
}
