//! The model endpoints' circuit breakers and fallbacks (docs/outage.md): their metrics'
//! definitions, in the catalogue of `metrics.rs`, and the methods that record them.

use metrics::Recorder;

use super::{Def, Metrics, key, metadata};

/// The states a breaker is in, as the model's breaker names them (`BreakerState::as_str`):
/// one series each.
const STATES: [&str; 3] = ["closed", "open", "half_open"];

pub(super) const TRANSITIONS: Def = Def {
    name: "checkout_model_breaker_transitions_total",
    help: "Transitions of a model endpoint's circuit breaker, by endpoint (model#position in the chain, 1 the primary) and the state entered (open, half_open, closed) from the state left.",
    buckets: None,
};
pub(super) const REFUSED: Def = Def {
    name: "checkout_model_breaker_refused_total",
    help: "Model requests not sent because the endpoint's circuit breaker was open (or its one trial request was out), by endpoint.",
    buckets: None,
};
pub(super) const FALLBACK_TURNS: Def = Def {
    name: "checkout_model_fallback_turns_total",
    help: "Model turns answered by an endpoint other than the primary, because every endpoint before it failed transiently (or its breaker was open), by the endpoint that answered.",
    buckets: None,
};
/// A gauge, one series per state: 1 for the breaker's state, 0 for the others.
pub(super) const STATE: Def = Def {
    name: "checkout_model_breaker_state",
    help: "The state of a model endpoint's circuit breaker: 1 on the series of its state (closed, open, half_open), 0 on the others.",
    buckets: None,
};

impl Metrics {
    /// A model endpoint's circuit breaker is in `state`, one of `closed`, `open`,
    /// `half_open` (set at start and on each transition).
    pub fn breaker_state(&self, endpoint: &str, state: &'static str) {
        debug_assert!(STATES.contains(&state), "{state}");
        for each in STATES {
            let labels = [("endpoint", endpoint), ("state", each)];
            self.0
                .recorder
                .register_gauge(&key(&STATE, &labels), &metadata())
                .set(if each == state { 1.0 } else { 0.0 });
        }
    }

    /// A model endpoint's circuit breaker went from `from` to `to`.
    pub fn breaker_transition(&self, endpoint: &str, from: &'static str, to: &'static str) {
        let labels = [("endpoint", endpoint), ("from", from), ("to", to)];
        self.counter(&TRANSITIONS, &labels, 1);
        self.breaker_state(endpoint, to);
    }

    /// A model request was not sent: the endpoint's breaker is open.
    pub fn breaker_refused(&self, endpoint: &str) {
        self.counter(&REFUSED, &[("endpoint", endpoint)], 1);
    }

    /// A model turn was answered by `endpoint`, a fallback.
    pub fn fallback_turn(&self, endpoint: &str) {
        self.counter(&FALLBACK_TURNS, &[("endpoint", endpoint)], 1);
    }
}
