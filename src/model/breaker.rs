//! The circuit breaker of one model endpoint, a tower layer between the request retry and
//! the request timeout: it counts every request sent (retries too) and, while the endpoint
//! is failing, sends none.
//!
//! Closed, it keeps the outcomes of the last `window` requests; when the window is full
//! and at least `failure_percent` of them failed transiently (the request retry's own
//! classifier: connect error, timeout, broken connection, 408, 429, 5xx), it opens. Open,
//! no request leaves for `open`; then exactly one trial request goes (half open, every
//! other request refused while it runs); its success closes the breaker with an empty
//! window, its failure opens it again. A 4xx that is ours (400, 401, 403, 404, 422) is an
//! answer: it counts as a success.
//!
//! Our own layer, not a crate's (docs/outage.md says more): tower-resilience's circuit
//! breaker counts its "count-based window" from the last transition, not over the last N
//! calls, so a long healthy run outweighs an outage for as long; recloser's half-open
//! state lets every request through (no single trial), has no state accessor and no
//! transition hook for the metrics, and is not a tower layer.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tower::timeout::error::Elapsed;
use tower::{BoxError, Layer, Service};

use super::call::ModelCall;
use super::error::{ModelError, ModelErrorKind};
use super::wire::ChatResponse;
use crate::metrics::Metrics;

/// The breaker's numbers, from the settings (`CHECKOUT_BREAKER_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Requests whose outcomes are kept.
    pub window: u32,
    /// The share of them, in percent, that opens the breaker when failed.
    pub failure_percent: u32,
    /// How long it stays open before its trial request.
    pub open: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub const ALL: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// One endpoint's breaker; clones share it. Also the handle `/health/ready` reads.
#[derive(Clone)]
pub struct Breaker(Arc<Shared>);

struct Shared {
    /// The endpoint, as the log and `/health/ready` name it (`model@base_url`).
    name: String,
    /// As the metrics name it: `model#position`, without the URL (an address is never a
    /// label).
    metric_label: String,
    settings: BreakerSettings,
    metrics: Metrics,
    circuit: Mutex<Circuit>,
}

struct Circuit {
    state: BreakerState,
    /// True for a failed request, oldest first; only while closed.
    outcomes: VecDeque<bool>,
    opened_at: Instant,
    /// The trial request is out (half open).
    trial: bool,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Breaker({}: {})", self.0.name, self.state().as_str())
    }
}

/// What the breaker let through.
enum Admission {
    Closed,
    Trial,
}

impl Breaker {
    pub fn new(
        name: String,
        metric_label: String,
        settings: BreakerSettings,
        metrics: &Metrics,
    ) -> Breaker {
        metrics.breaker_state(&metric_label, BreakerState::Closed.as_str());
        Breaker(Arc::new(Shared {
            name,
            metric_label,
            settings,
            metrics: metrics.clone(),
            circuit: Mutex::new(Circuit {
                state: BreakerState::Closed,
                outcomes: VecDeque::with_capacity(settings.window as usize),
                opened_at: Instant::now(),
                trial: false,
            }),
        }))
    }

    /// The endpoint's name (`model@base_url`, [`ModelEndpoint::name`]).
    ///
    /// [`ModelEndpoint::name`]: crate::model::ModelEndpoint::name
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The endpoint's name in the metrics (`model#position`).
    pub fn metric_label(&self) -> &str {
        &self.0.metric_label
    }

    /// The state as of the last request: an open breaker whose time is up reads open
    /// until a request comes for its trial.
    pub fn state(&self) -> BreakerState {
        self.circuit().state
    }

    fn circuit(&self) -> std::sync::MutexGuard<'_, Circuit> {
        self.0.circuit.lock().expect("never poisoned")
    }

    fn admit(&self) -> Option<Admission> {
        let mut circuit = self.circuit();
        match circuit.state {
            BreakerState::Closed => Some(Admission::Closed),
            BreakerState::Open if circuit.opened_at.elapsed() >= self.0.settings.open => {
                self.enter(&mut circuit, BreakerState::HalfOpen);
                circuit.trial = true;
                Some(Admission::Trial)
            }
            BreakerState::HalfOpen if !circuit.trial => {
                circuit.trial = true;
                Some(Admission::Trial)
            }
            BreakerState::Open | BreakerState::HalfOpen => None,
        }
    }

    /// A request's outcome. Outcomes of requests let through while closed that end after
    /// the breaker opened are not counted: the breaker has judged already.
    fn record(&self, admission: &Admission, failed: bool) {
        let mut circuit = self.circuit();
        match admission {
            Admission::Trial => {
                circuit.trial = false;
                let next = if failed {
                    BreakerState::Open
                } else {
                    BreakerState::Closed
                };
                self.enter(&mut circuit, next);
            }
            Admission::Closed if circuit.state == BreakerState::Closed => {
                let window = self.0.settings.window as usize;
                circuit.outcomes.push_back(failed);
                if circuit.outcomes.len() > window {
                    circuit.outcomes.pop_front();
                }
                let failures = circuit.outcomes.iter().filter(|f| **f).count();
                if circuit.outcomes.len() == window
                    && failures * 100 >= window * self.0.settings.failure_percent as usize
                {
                    self.enter(&mut circuit, BreakerState::Open);
                }
            }
            Admission::Closed => {}
        }
    }

    /// A trial request that never ended (its caller gave up): the next request may try.
    fn abandon(&self) {
        self.circuit().trial = false;
    }

    fn enter(&self, circuit: &mut Circuit, state: BreakerState) {
        let from = circuit.state;
        circuit.state = state;
        circuit.outcomes.clear();
        if state == BreakerState::Open {
            circuit.opened_at = Instant::now();
        }
        let Shared {
            name: endpoint,
            metric_label,
            settings,
            metrics,
            ..
        } = &*self.0;
        metrics.breaker_transition(metric_label, from.as_str(), state.as_str());
        let (from, to) = (from.as_str(), state.as_str());
        match state {
            BreakerState::Open => tracing::warn!(
                endpoint,
                from,
                to,
                "circuit breaker opened: at least {}% of the last {} requests to {endpoint} failed (or its trial request did); no request leaves for it for {} ms, its turns go to the next endpoint",
                settings.failure_percent,
                settings.window,
                settings.open.as_millis()
            ),
            BreakerState::HalfOpen => tracing::info!(
                endpoint,
                from,
                to,
                "circuit breaker half open: one trial request goes to {endpoint}"
            ),
            BreakerState::Closed => tracing::info!(
                endpoint,
                from,
                to,
                "circuit breaker closed: the trial request to {endpoint} succeeded; its turns return to it"
            ),
        }
    }
}

/// Whether an outcome is a transient failure of the endpoint (what the request retry
/// would repeat, the request timeout included), a success, or neither: a send that timed
/// out before it had a connection or stream to go on waited in the service, not on the
/// endpoint.
fn failed(result: &Result<ChatResponse, BoxError>, on_wire: bool) -> Option<bool> {
    match result {
        Ok(_) => Some(false),
        Err(err) if err.is::<Elapsed>() => on_wire.then_some(true),
        Err(err) => Some(
            err.downcast_ref::<ModelError>()
                .is_some_and(|e| e.kind.is_retryable()),
        ),
    }
}

#[derive(Clone)]
pub struct BreakerLayer(pub Breaker);

impl<S> Layer<S> for BreakerLayer {
    type Service = BreakerService<S>;

    fn layer(&self, inner: S) -> BreakerService<S> {
        BreakerService {
            inner,
            breaker: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct BreakerService<S> {
    inner: S,
    breaker: Breaker,
}

impl<S> Service<ModelCall> for BreakerService<S>
where
    S: Service<ModelCall, Response = ChatResponse, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = ChatResponse;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<ChatResponse, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: ModelCall) -> Self::Future {
        let Some(admission) = self.breaker.admit() else {
            self.breaker
                .0
                .metrics
                .breaker_refused(self.breaker.metric_label());
            let err = ModelError::new(ModelErrorKind::CircuitOpen);
            return Box::pin(std::future::ready(Err(Box::new(err) as BoxError)));
        };
        let guard = Outcome {
            breaker: self.breaker.clone(),
            admission: Some(admission),
        };
        let on_wire = Arc::new(AtomicBool::new(false));
        call.on_wire = on_wire.clone();
        let sent = self.inner.call(call);
        Box::pin(async move {
            let result = sent.await;
            match failed(&result, on_wire.load(Ordering::Relaxed)) {
                Some(failed) => guard.record(failed),
                // Uncounted: a trial's slot is freed as if it were abandoned.
                None => drop(guard),
            }
            result
        })
    }
}

/// Records the request's outcome, or on drop (the caller gave up first) frees the trial.
struct Outcome {
    breaker: Breaker,
    admission: Option<Admission>,
}

impl Outcome {
    fn record(mut self, failed: bool) {
        if let Some(admission) = self.admission.take() {
            self.breaker.record(&admission, failed);
        }
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if let Some(Admission::Trial) = self.admission {
            self.breaker.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(open_ms: u64) -> Breaker {
        let settings = BreakerSettings {
            window: 4,
            failure_percent: 50,
            open: Duration::from_millis(open_ms),
        };
        Breaker::new("m@http://x".into(), "m#1".into(), settings, &Metrics::new())
    }

    fn request(b: &Breaker, failed: bool) -> bool {
        match b.admit() {
            Some(admission) => {
                b.record(&admission, failed);
                true
            }
            None => false,
        }
    }

    #[test]
    fn opens_when_half_of_a_full_window_failed_and_not_before() {
        let b = breaker(60_000);
        for failed in [true, true, false] {
            assert!(request(&b, failed));
        }
        assert_eq!(b.state(), BreakerState::Closed, "the window is not full");
        assert!(request(&b, false));
        assert_eq!(b.state(), BreakerState::Open, "2 of the last 4 failed");
        assert!(!request(&b, false), "open: nothing leaves");
    }

    #[test]
    fn the_window_slides_old_outcomes_out() {
        let b = breaker(60_000);
        for failed in [true, false, false, false, false, true] {
            assert!(request(&b, failed));
        }
        // The last four: false, false, false, true.
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn one_trial_after_the_open_time_and_its_success_closes() {
        let b = breaker(0);
        for _ in 0..4 {
            request(&b, true);
        }
        assert_eq!(b.state(), BreakerState::Open);
        let trial = b.admit().expect("the open time is over");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(b.admit().is_none(), "one trial at a time");
        b.record(&trial, false);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn a_failed_trial_opens_again_and_an_abandoned_one_frees_its_slot() {
        let b = breaker(0);
        for _ in 0..4 {
            request(&b, true);
        }
        let trial = b.admit().unwrap();
        assert!(b.admit().is_none());
        // The caller gave up before the trial ended: its guard is dropped unrecorded.
        drop(Outcome {
            breaker: b.clone(),
            admission: Some(trial),
        });
        let trial = b.admit().expect("the abandoned trial's slot is free");
        b.record(&trial, true);
        assert_eq!(b.state(), BreakerState::Open);
    }
}
