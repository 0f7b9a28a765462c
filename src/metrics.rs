//! The service's Prometheus metrics: every name, its HELP text, its buckets and its labels
//! live here, and the flow records an event by calling one named method of [`Metrics`].
//!
//! Each [`App`](crate::App) owns its own recorder (not the process-global one), so two
//! apps in one process — the tests — count apart, and `GET /metrics` shows the counts of
//! the app that serves it.
//!
//! Labels are small closed sets (a layer, a reason, an outcome code, the configured model
//! name): never an Idempotency-Key, an order id, an address or anything a client chooses.
//!
//! The model's metrics follow the OpenTelemetry GenAI semantic conventions, **pinned to
//! semconv v1.37.0** (`gen_ai.client.operation.duration` in seconds and
//! `gen_ai.client.token.usage` in tokens, with their advised bucket boundaries and the
//! attributes `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`,
//! `gen_ai.token.type`, `error.type`), named for Prometheus as OpenTelemetry's Prometheus
//! exporter names them: dots become underscores, the unit `s` adds `_seconds`, and an
//! annotation unit such as `{token}` adds nothing.
//!
//! To add a metric (auth failures, journal replays and tokens saved, emails queued / sent /
//! failed, payment-provider calls by outcome): one `Def` in `CATALOGUE` and one
//! method below that records it; the flow then calls the method, one line.

use std::sync::Arc;
use std::time::Duration;

use metrics::{Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

mod approvals;
mod breaker;
mod genai;
mod refunds;
mod webhooks;

pub use genai::GenAiTarget;

/// What one metric is.
struct Def {
    name: &'static str,
    help: &'static str,
    /// Upper bounds of the histogram's buckets; `None` for a counter.
    buckets: Option<&'static [f64]>,
}

const CHECKOUTS: Def = Def {
    name: "checkout_checkouts_total",
    help: "Checkouts answered (POST /checkout, and their resumes), by outcome: code=\"ok\" for a confirmed charge (made now or found), else the problem code; invalid_request counts orders refused by validation (a body or header the request parsers refuse is not counted). A replayed Idempotency-Key answer is not counted here.",
    buckets: None,
};
const CHARGES: Def = Def {
    name: "checkout_charges_total",
    help: "Charge tool calls that reached the payment store, by result: created (this call charged the order) or found (the order's charge key found its earlier charge; nothing was charged).",
    buckets: None,
};
const RETRIES: Def = Def {
    name: "checkout_retries_total",
    help: "Retries made, by layer (request: one model request; loop: the whole assistant loop; provider: one payment-provider request, re-sent with the same Idempotency-Key) and by the failure retried.",
    buckets: None,
};
const BUDGET_REFUSALS: Def = Def {
    name: "checkout_retry_budget_refusals_total",
    help: "Request retries not made because the retry budget shared by all model requests was empty (not counted in checkout_retries_total).",
    buckets: None,
};
const SPEND_BUDGET_REFUSALS: Def = Def {
    name: "checkout_budget_refusals_total",
    help: "Charges refused because they would pass their caller's budget for the UTC day (CHECKOUT_BUDGET_PER_DAY, or the API key's own): nothing charged, the checkout answered 403 budget_exceeded.",
    buckets: None,
};
const TIMEOUTS: Def = Def {
    name: "checkout_timeouts_total",
    help: "Timeouts that fired, by layer: request (one model request), loop (one run of the assistant loop), server (one HTTP request to this service).",
    buckets: None,
};
const LOOP_ROUNDS: Def = Def {
    name: "checkout_loop_rounds",
    help: "Rounds per run of the assistant loop: a round is one chat-completions request (its retries not counted) or one model answer replayed from the journal.",
    buckets: Some(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0]),
};
const IDEMPOTENCY_KEYS: Def = Def {
    name: "checkout_idempotency_keys_total",
    help: "Requests that carried an Idempotency-Key, by outcome: new (the work ran), replay (the saved answer was sent), in_flight (409, still running), key_reuse (422, another request's key).",
    buckets: None,
};
const AUTH_FAILURES: Def = Def {
    name: "checkout_auth_failures_total",
    help: "Requests to /checkout or /receipts refused with 401, by reason: missing (no Authorization header), not_bearer (another scheme), invalid (an unknown or revoked API key).",
    buckets: None,
};
const JOURNAL_REPLAYED: Def = Def {
    name: "checkout_journal_replayed_steps_total",
    help: "Steps a resumed loop took from its journal instead of running them again, by kind: answer (a model answer not asked for again) or tool (a tool result not run again).",
    buckets: None,
};
const JOURNAL_TOKENS_SAVED: Def = Def {
    name: "checkout_journal_tokens_saved_total",
    help: "Tokens of the model answers replayed from the journal, as the provider reported them when they were first asked for: what the resume did not pay again, by type (input, output).",
    buckets: None,
};

const EMAILS: Def = Def {
    name: "checkout_emails_total",
    help: "Delivery attempts of outbox messages (the confirmation email), by result: sent (the SMTP server accepted it, or its .eml file was written), retried (a transient failure: 4xx, a broken connection, a timeout; tried again later), failed (a permanent 5xx, or the last attempt failed; not sent again).",
    buckets: None,
};

const PROVIDER_REQUESTS: Def = Def {
    name: "checkout_provider_requests_total",
    help: "HTTP requests to the payment provider, each retry its own, by operation (create: POST /v1/payment_intents; search: the look-up by metadata) and outcome: succeeded, declined, requires_action, other (another PaymentIntent status), answered (a search's 200), in_use (409 idempotency_key_in_use, retried), idempotency_error (400: the same key with other parameters, a bug), server_error (5xx), timeout, transport (the connection failed or dropped), refused (another 4xx), malformed.",
    buckets: None,
};
const PROVIDER_DURATION: Def = Def {
    name: "checkout_provider_request_duration_seconds",
    help: "Duration of one HTTP request to the payment provider, each retry its own, by operation.",
    buckets: Some(&[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
};

const REFUSALS: Def = Def {
    name: "checkout_refusals_total",
    help: "POST /checkout requests refused before anything was run or written, by code: overloaded (503: the instance ran CHECKOUT_MAX_IN_FLIGHT loops), rate_limited (429: the caller was over CHECKOUT_RATE_LIMIT_PER_SEC). Not counted in checkout_checkouts_total.",
    buckets: None,
};
const IN_FLIGHT: Def = Def {
    name: "checkout_loops_in_flight",
    help: "Checkout loops running now in this instance (clients' checkouts and the recovery sweep's resumes).",
    buckets: None,
};
const IN_FLIGHT_LIMIT: Def = Def {
    name: "checkout_loops_in_flight_limit",
    help: "The most checkout loops this instance runs at once (CHECKOUT_MAX_IN_FLIGHT, as sized at start-up); one more is refused with 503 overloaded.",
    buckets: None,
};

/// Gauges: described and registered apart from the counters and histograms.
const GAUGES: &[&Def] = &[
    &IN_FLIGHT,
    &IN_FLIGHT_LIMIT,
    &breaker::STATE,
    &approvals::PENDING,
    &webhooks::PENDING,
    &webhooks::OLDEST,
];

const CATALOGUE: &[&Def] = &[
    &webhooks::DELIVERIES,
    &approvals::DECIDED,
    &refunds::REFUNDS,
    &refunds::REFUNDED,
    &refunds::REFUND_OPERATIONS,
    &approvals::ASKED,
    &REFUSALS,
    &breaker::TRANSITIONS,
    &breaker::REFUSED,
    &breaker::FALLBACK_TURNS,
    &EMAILS,
    &PROVIDER_REQUESTS,
    &PROVIDER_DURATION,
    &AUTH_FAILURES,
    &JOURNAL_REPLAYED,
    &JOURNAL_TOKENS_SAVED,
    &CHECKOUTS,
    &CHARGES,
    &RETRIES,
    &BUDGET_REFUSALS,
    &SPEND_BUDGET_REFUSALS,
    &TIMEOUTS,
    &LOOP_ROUNDS,
    &IDEMPOTENCY_KEYS,
    &genai::DURATION,
    &genai::TOKENS,
];

/// The retry layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryLayer {
    Request,
    Loop,
    /// One request to the payment provider, re-sent with the same Idempotency-Key.
    Provider,
}

/// The timeout layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimedOut {
    Request,
    Loop,
    Server,
}

/// What became of a request's Idempotency-Key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOutcome {
    New,
    Replay,
    InFlight,
    KeyReuse,
}

/// What a delivery attempt of an outbox message came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmailOutcome {
    Sent,
    Retried,
    Failed,
}

impl EmailOutcome {
    fn label(self) -> &'static str {
        match self {
            EmailOutcome::Sent => "sent",
            EmailOutcome::Retried => "retried",
            EmailOutcome::Failed => "failed",
        }
    }
}

/// The app's metrics. Cloning is cheap; every clone records into the same registry.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

struct Inner {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// The series every checkout records into, registered once.
    hot: Hot,
}

struct Hot {
    checkouts_ok: metrics::Counter,
    charges_created: metrics::Counter,
    loop_rounds: metrics::Histogram,
    in_flight: metrics::Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut builder = PrometheusBuilder::new();
        for def in CATALOGUE {
            if let Some(buckets) = def.buckets {
                builder = builder
                    .set_buckets_for_metric(Matcher::Full(def.name.into()), buckets)
                    .expect("every histogram has buckets");
            }
        }
        let recorder = builder.build_recorder();
        for def in CATALOGUE {
            match def.buckets {
                Some(_) => recorder.describe_histogram(def.name.into(), None, def.help.into()),
                None => recorder.describe_counter(def.name.into(), None, def.help.into()),
            }
        }
        for def in GAUGES {
            recorder.describe_gauge(def.name.into(), None, def.help.into());
        }
        let handle = recorder.handle();
        let hot = Hot {
            checkouts_ok: recorder
                .register_counter(&key(&CHECKOUTS, &[("code", "ok")]), &metadata()),
            charges_created: recorder.register_counter(
                &key(&CHARGES, &[("result", charge_result(true))]),
                &metadata(),
            ),
            loop_rounds: recorder.register_histogram(&key(&LOOP_ROUNDS, &[]), &metadata()),
            in_flight: recorder.register_gauge(&key(&IN_FLIGHT, &[]), &metadata()),
        };
        let metrics = Metrics(Arc::new(Inner {
            recorder,
            handle,
            hot,
        }));
        // Counters of a closed label set start at zero, so that a rate over them exists
        // before the first event.
        for created in [true, false] {
            metrics.counter(&CHARGES, &[("result", charge_result(created))], 0);
        }
        for layer in [TimedOut::Request, TimedOut::Loop, TimedOut::Server] {
            metrics.counter(&TIMEOUTS, &[("layer", layer.label())], 0);
        }
        for outcome in [
            KeyOutcome::New,
            KeyOutcome::Replay,
            KeyOutcome::InFlight,
            KeyOutcome::KeyReuse,
        ] {
            metrics.counter(&IDEMPOTENCY_KEYS, &[("outcome", outcome.label())], 0);
        }
        metrics.counter(&BUDGET_REFUSALS, &[], 0);
        metrics.counter(&SPEND_BUDGET_REFUSALS, &[], 0);
        for outcome in [
            EmailOutcome::Sent,
            EmailOutcome::Retried,
            EmailOutcome::Failed,
        ] {
            metrics.counter(&EMAILS, &[("result", outcome.label())], 0);
        }
        for code in ["overloaded", "rate_limited"] {
            metrics.counter(&REFUSALS, &[("code", code)], 0);
        }
        metrics.in_flight(0);
        metrics.in_flight_limit(0);
        for reason in ["missing", "not_bearer", "invalid"] {
            metrics.counter(&AUTH_FAILURES, &[("reason", reason)], 0);
        }
        for kind in ["answer", "tool"] {
            metrics.counter(&JOURNAL_REPLAYED, &[("kind", kind)], 0);
        }
        for kind in ["input", "output"] {
            metrics.counter(&JOURNAL_TOKENS_SAVED, &[("type", kind)], 0);
        }
        metrics.approvals_start();
        metrics.refunds_start();
        metrics.webhooks_start();
        metrics
    }

    /// A request was refused for want of a valid API key (`reason`: missing, not_bearer,
    /// invalid).
    pub fn auth_failure(&self, reason: &'static str) {
        self.counter(&AUTH_FAILURES, &[("reason", reason)], 1);
    }

    /// A model answer was replayed from the journal; `tokens` (input, output) are what it
    /// cost when first asked for.
    pub fn journal_replayed_answer(&self, tokens: (u64, u64)) {
        self.counter(&JOURNAL_REPLAYED, &[("kind", "answer")], 1);
        self.counter(&JOURNAL_TOKENS_SAVED, &[("type", "input")], tokens.0);
        self.counter(&JOURNAL_TOKENS_SAVED, &[("type", "output")], tokens.1);
    }

    /// A delivery attempt of an outbox message ended so.
    pub fn email(&self, outcome: EmailOutcome) {
        self.counter(&EMAILS, &[("result", outcome.label())], 1);
    }

    /// A tool result was replayed from the journal.
    pub fn journal_replayed_tool(&self) {
        self.counter(&JOURNAL_REPLAYED, &[("kind", "tool")], 1);
    }

    /// The Prometheus text exposition of everything recorded so far.
    pub fn render(&self) -> String {
        self.0.handle.render()
    }

    /// One request to the payment provider (`operation`: create, search) ended with
    /// `outcome` after `took`.
    pub fn provider_request(&self, operation: &'static str, outcome: &'static str, took: Duration) {
        self.counter(
            &PROVIDER_REQUESTS,
            &[("operation", operation), ("outcome", outcome)],
            1,
        );
        self.histogram(
            &PROVIDER_DURATION,
            &[("operation", operation)],
            took.as_secs_f64(),
        );
    }

    /// A POST /checkout was refused before it ran (`code`: overloaded, rate_limited).
    pub fn refused(&self, code: &'static str) {
        self.counter(&REFUSALS, &[("code", code)], 1);
    }

    /// A loop took (`1`) or gave back (`-1`) its admission slot.
    pub fn in_flight(&self, change: i8) {
        self.0.hot.in_flight.increment(f64::from(change));
    }

    pub fn in_flight_limit(&self, limit: usize) {
        self.gauge(&IN_FLIGHT_LIMIT).set(limit as f64);
    }

    fn gauge(&self, def: &Def) -> metrics::Gauge {
        self.0.recorder.register_gauge(&key(def, &[]), &metadata())
    }

    /// A checkout answered: `ok`, or the problem code it ended with.
    pub fn checkout(&self, code: &'static str) {
        match code {
            "ok" => self.0.hot.checkouts_ok.increment(1),
            _ => self.counter(&CHECKOUTS, &[("code", code)], 1),
        }
    }

    /// A charge call reached the payment store and made (`created`) or found the charge.
    pub fn charge(&self, created: bool) {
        match created {
            true => self.0.hot.charges_created.increment(1),
            false => self.counter(&CHARGES, &[("result", charge_result(created))], 1),
        }
    }

    /// A retry layer is repeating its unit after `reason` (a short stable name).
    pub fn retry(&self, layer: RetryLayer, reason: &'static str) {
        let layer = match layer {
            RetryLayer::Request => "request",
            RetryLayer::Loop => "loop",
            RetryLayer::Provider => "provider",
        };
        self.counter(&RETRIES, &[("layer", layer), ("reason", reason)], 1);
    }

    /// The request retry would have repeated a request, but the budget was empty.
    pub fn retry_budget_refused(&self) {
        self.counter(&BUDGET_REFUSALS, &[], 1);
    }

    /// A charge was refused for passing its caller's budget for the day.
    pub fn budget_refusal(&self) {
        self.counter(&SPEND_BUDGET_REFUSALS, &[], 1);
    }

    pub fn timeout(&self, layer: TimedOut) {
        self.counter(&TIMEOUTS, &[("layer", layer.label())], 1);
    }

    /// Counts the rounds of one run of the loop: call [`LoopRounds::reached`] at each
    /// round; the count is recorded when the guard is dropped, so a run cut off by the
    /// loop timeout is counted too.
    pub fn loop_rounds(&self) -> LoopRounds {
        LoopRounds {
            metrics: self.clone(),
            rounds: 0,
        }
    }

    pub fn idempotency_key(&self, outcome: KeyOutcome) {
        self.counter(&IDEMPOTENCY_KEYS, &[("outcome", outcome.label())], 1);
    }

    fn counter(&self, def: &Def, labels: &[(&str, &str)], by: u64) {
        let key = key(def, labels);
        self.0
            .recorder
            .register_counter(&key, &metadata())
            .increment(by);
    }

    fn histogram(&self, def: &Def, labels: &[(&str, &str)], value: f64) {
        let key = key(def, labels);
        self.0
            .recorder
            .register_histogram(&key, &metadata())
            .record(value);
    }
}

/// See [`Metrics::loop_rounds`].
pub struct LoopRounds {
    metrics: Metrics,
    rounds: u32,
}

impl LoopRounds {
    pub fn reached(&mut self, round: u32) {
        self.rounds = round;
    }
}

impl Drop for LoopRounds {
    fn drop(&mut self) {
        self.metrics
            .0
            .hot
            .loop_rounds
            .record(f64::from(self.rounds));
    }
}

impl TimedOut {
    fn label(self) -> &'static str {
        match self {
            TimedOut::Request => "request",
            TimedOut::Loop => "loop",
            TimedOut::Server => "server",
        }
    }
}

impl KeyOutcome {
    fn label(self) -> &'static str {
        match self {
            KeyOutcome::New => "new",
            KeyOutcome::Replay => "replay",
            KeyOutcome::InFlight => "in_flight",
            KeyOutcome::KeyReuse => "key_reuse",
        }
    }
}

fn charge_result(created: bool) -> &'static str {
    if created { "created" } else { "found" }
}

fn key(def: &Def, labels: &[(&str, &str)]) -> Key {
    let labels: Vec<Label> = labels
        .iter()
        .map(|(k, v)| Label::new(k.to_string(), v.to_string()))
        .collect();
    Key::from_parts(def.name, labels)
}

fn metadata() -> Metadata<'static> {
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_help_and_its_type_and_histograms_count_in_their_buckets() {
        let metrics = Metrics::new();
        metrics.checkout("ok");
        metrics.retry(RetryLayer::Request, "http_503");
        metrics.timeout(TimedOut::Loop);
        metrics.charge(true);
        metrics.loop_rounds().reached(3);
        metrics.provider_request("create", "succeeded", Duration::from_millis(20));
        let target = metrics.genai_target("openai", "m");
        metrics.chat(&target, Duration::from_millis(30), Ok(Some((7, 2))));
        metrics.breaker_transition("m", "closed", "open");
        metrics.breaker_refused("m");
        metrics.fallback_turn("m");
        metrics.refunded("USD", 100);
        metrics.refund_answered("ok");
        let text = metrics.render();
        for def in CATALOGUE {
            assert!(
                text.contains(&format!("# HELP {} ", def.name)),
                "{}: {text}",
                def.name
            );
            let kind = if def.buckets.is_some() {
                "histogram"
            } else {
                "counter"
            };
            assert!(
                text.contains(&format!("# TYPE {} {kind}\n", def.name)),
                "{}: {text}",
                def.name
            );
        }
        for def in GAUGES {
            assert!(
                text.contains(&format!("# TYPE {} gauge\n", def.name)),
                "{}: {text}",
                def.name
            );
        }
        assert!(
            text.contains("checkout_checkouts_total{code=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("checkout_loop_rounds_bucket{le=\"3\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("checkout_loop_rounds_bucket{le=\"2\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE gen_ai_client_token_usage histogram"),
            "{text}"
        );
        assert!(
            text.contains("gen_ai_client_token_usage_sum{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"openai\",gen_ai_request_model=\"m\",gen_ai_token_type=\"input\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("checkout_timeouts_total{layer=\"server\"} 0"),
            "{text}"
        );
    }
}
