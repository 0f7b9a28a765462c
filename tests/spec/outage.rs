//! An outage of the model provider: a fallback endpoint answers the turns the primary
//! cannot, a circuit breaker per endpoint stops sending to one that is down, and a paid
//! order is never answered as an error. Both endpoints are real HTTP servers (the
//! scripted model, with its fault plans); a refused connection is a port nobody listens
//! on. The script has two rounds: the model charges (round 1), then confirms (round 2).

use std::time::Duration;

use crate::common::{Backend, Harness, Reply, TestDb, scripted, test_settings};
use checkout::config::Settings;
use checkout::model::scripted::{FaultRule, ScriptedModel};

const PRIMARY: &str = "primary-model";
const FALLBACK: &str = "fallback-model";

/// The primary at `primary_url`, the fallback (the scripted model `fallback`) after it;
/// request retries 2, loop retries 2, the breaker's window 20 (the default) and its open
/// time as given.
fn with_fallback(s: &mut Settings, primary_url: &str, fallback: &ScriptedModel, open_ms: u64) {
    s.model.base_url = Some(primary_url.to_owned());
    s.model.name = PRIMARY.into();
    s.model.fallback_base_url = Some(fallback.base_url());
    s.model.fallback_model = Some(FALLBACK.into());
    s.model.breaker.window = 20;
    s.model.breaker.open = Duration::from_millis(open_ms);
}

/// The primary (the harness's scripted model, following `primary_faults`) and a fallback
/// following `fallback_faults`.
async fn start(
    backend: Backend,
    primary_faults: &str,
    fallback_faults: &str,
    tune: impl FnOnce(&mut Settings),
) -> (Harness, ScriptedModel) {
    let fallback = scripted(fallback_faults).await;
    let db = TestDb::new(backend).await;
    let primary = scripted(primary_faults).await;
    let mut settings = test_settings(&db, &primary);
    with_fallback(&mut settings, &primary.base_url(), &fallback, 60_000);
    tune(&mut settings);
    (Harness::serve(db, primary, settings).await, fallback)
}

/// An address nobody listens on: bound, then let go.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// The value of the one `/metrics` sample whose line has every one of `parts`.
async fn metric(h: &Harness, parts: &[&str]) -> f64 {
    let text = h.get("/metrics").await.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
        .collect();
    assert_eq!(lines.len(), 1, "one sample with {parts:?} in:\n{text}");
    lines[0].rsplit(' ').next().unwrap().parse().unwrap()
}

/// Each endpoint's breaker state, as `/health/ready` says it (200 throughout).
async fn breakers(h: &Harness) -> Vec<String> {
    let ready = h.get("/health/ready").await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    ready.json()["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["breaker"].as_str().unwrap().to_owned())
        .collect()
}

fn models(reply: &Reply) -> Vec<String> {
    serde_json::from_value(reply.json()["usage"]["models"].clone()).unwrap()
}

/// 30 checkouts, one after the other, each 200 with its one receipt, each answered by
/// the fallback alone.
async fn thirty_checkouts_answered_by_the_fallback(h: &Harness) {
    for i in 1..=30 {
        let order = format!("OUT-{i}");
        let reply = h.checkout(&order, "10.00").await;
        assert_eq!(reply.status, 200, "checkout {i}: {}", reply.text());
        assert_eq!(reply.json()["messageSource"], "model");
        assert_eq!(models(&reply), [FALLBACK], "checkout {i}");
        assert_eq!(h.db.receipts(&order).await, 1, "checkout {i}");
    }
    assert_eq!(h.db.all_receipts().await, 30);
}

both_backends!(
    a_primary_answering_503_costs_one_window_of_requests_then_the_fallback_answers_every_turn,
    |backend| async move {
        let (h, fallback) = start(backend, "503", "", |_| {}).await;
        thirty_checkouts_answered_by_the_fallback(&h).await;
        // 60 turns: the first 20 each sent once to the primary (its 503 goes to the
        // fallback, not to a retry), then its breaker opened for the rest (60 s).
        assert_eq!(h.model.requests(), 20, "requests to the primary");
        assert_eq!(fallback.requests(), 60, "one per turn");
        assert_eq!(breakers(&h).await, ["open", "closed"]);
        let primary = format!("endpoint=\"{PRIMARY}#1\"");
        assert_eq!(
            metric(&h, &["checkout_model_breaker_refused_total", &primary]).await,
            40.0
        );
        assert_eq!(
            metric(
                &h,
                &["checkout_model_fallback_turns_total", "fallback-model#2"]
            )
            .await,
            60.0
        );
        assert_eq!(
            metric(
                &h,
                &["checkout_model_breaker_state{", &primary, "state=\"open\""]
            )
            .await,
            1.0
        );
    }
);

both_backends!(
    a_primary_refusing_connections_costs_one_window_of_attempts,
    |backend| async move {
        let (h, fallback) = start(backend, "", "", |s| {
            s.model.base_url = Some(dead_url());
        })
        .await;
        thirty_checkouts_answered_by_the_fallback(&h).await;
        let connects = metric(
            &h,
            &[
                "gen_ai_client_operation_duration_seconds_count",
                "error_type=\"connect\"",
                PRIMARY,
            ],
        )
        .await;
        assert_eq!(connects, 20.0, "connection attempts to the primary");
        assert_eq!(
            h.model.requests(),
            0,
            "the harness's model is not in the chain"
        );
        assert_eq!(fallback.requests(), 60, "one per turn");
        assert_eq!(breakers(&h).await, ["open", "closed"]);
    }
);

both_backends!(
    a_primary_failing_after_the_charge_leaves_the_confirmation_to_the_fallback,
    |backend| async move {
        let (h, fallback) = start(backend, "503@2", "", |_| {}).await;
        let reply = h
            .post(
                "/checkout?orderId=AFTER-1&amount=12.00",
                &[("Idempotency-Key", "outage-after-1")],
                None,
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["messageSource"], "model");
        assert_eq!(models(&reply), [PRIMARY, FALLBACK]);
        assert_eq!(h.db.receipts("AFTER-1").await, 1);
        // The primary: the charge round, then one 503 for the confirmation round.
        assert_eq!(h.model.requests(), 2);
        // The fallback: once, for round 2: the conversation with the charge's result.
        assert_eq!(fallback.requests(), 1);
        assert_eq!(fallback.requests_at_round(2), 1);
        // The journal says who answered each step.
        let by = |model: &'static str| {
            let sql = match model {
                PRIMARY => {
                    "SELECT count(*) FROM agent_journal WHERE kind = 'answer' AND name LIKE 'primary-model@http://127.0.0.1:%'"
                }
                _ => {
                    "SELECT count(*) FROM agent_journal WHERE kind = 'answer' AND name LIKE 'fallback-model@http://127.0.0.1:%'"
                }
            };
            h.db.count(sql, None)
        };
        assert_eq!(by(PRIMARY).await, 1);
        assert_eq!(by(FALLBACK).await, 1);
    }
);

both_backends!(
    every_endpoint_down_after_the_charge_answers_200_with_the_receipt_and_a_service_message,
    |backend| async move {
        let (h, fallback) = start(backend, "503@2", "503", |_| {}).await;
        let reply = h.checkout("PAID-1", "15.00").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let body = reply.json();
        assert_eq!(body["messageSource"], "service");
        assert_eq!(body["charged"], true);
        let receipt = body["receipt"]["id"].as_str().unwrap();
        assert!(
            body["message"].as_str().unwrap().contains(receipt),
            "{body}"
        );
        assert_eq!(models(&reply), [PRIMARY]);
        assert_eq!(h.db.receipts("PAID-1").await, 1);
        assert_eq!(body["attempts"], 3, "the loop retry had its say first");
        // The primary: the charge round, then one 503 per loop attempt; the fallback,
        // the last endpoint: its request and 2 request retries per loop attempt.
        assert_eq!(h.model.requests(), 4);
        assert_eq!(fallback.requests(), 9);
    }
);

both_backends!(
    every_endpoint_down_before_the_charge_is_502_and_charges_nothing,
    |backend| async move {
        let (h, fallback) = start(backend, "503", "503", |_| {}).await;
        let reply = h.checkout("DOWN-1", "15.00").await;
        let problem = reply.problem(502);
        assert_eq!(problem["code"], "model_error", "{problem}");
        assert_eq!(problem["orderCharged"], false, "{problem}");
        assert_eq!(h.db.all_receipts().await, 0);
        // 3 loop attempts, each: the primary once, the fallback 3 times (its retries).
        assert_eq!(h.model.requests(), 3);
        assert_eq!(fallback.requests(), 9);
    }
);

both_backends!(
    after_the_open_time_one_trial_request_returns_traffic_to_the_primary,
    |backend| async move {
        let (h, fallback) = start(backend, "503", "", |s| {
            s.model.breaker.window = 4;
            s.model.breaker.open = Duration::from_millis(500);
        })
        .await;
        for order in ["FLAP-1", "FLAP-2"] {
            assert_eq!(h.checkout(order, "5.00").await.status, 200);
        }
        assert_eq!(h.model.requests(), 4, "one window");
        assert_eq!(breakers(&h).await, ["open", "closed"]);
        h.model.set_faults(FaultRule::parse_plan("").unwrap());
        let reply = h.checkout("FLAP-3", "5.00").await;
        assert_eq!(models(&reply), [FALLBACK], "still open");
        assert_eq!(h.model.requests(), 4);
        tokio::time::sleep(Duration::from_millis(600)).await;
        let reply = h.checkout("FLAP-4", "5.00").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(models(&reply), [PRIMARY], "the trial succeeded");
        assert_eq!(h.model.requests(), 6);
        assert_eq!(fallback.requests(), 6, "FLAP-1..3, two turns each");
        assert_eq!(breakers(&h).await, ["closed", "closed"]);
        for (from, to) in [
            ("closed", "open"),
            ("open", "half_open"),
            ("half_open", "closed"),
        ] {
            let (from_label, to_label) = (format!("from=\"{from}\""), format!("to=\"{to}\""));
            let labels = [
                "checkout_model_breaker_transitions_total",
                PRIMARY,
                &from_label,
                &to_label,
            ];
            assert_eq!(metric(&h, &labels).await, 1.0, "{from} -> {to}");
        }
        assert_eq!(h.db.all_receipts().await, 4);
    }
);

const ERRORS: &str = "tests/fixtures/openai-errors";

both_backends!(
    a_conversation_too_long_for_the_primary_goes_to_the_fallback_and_opens_nothing,
    |backend| async move {
        let plan = format!("replay={ERRORS}/context-length-exceeded.http");
        let (h, fallback) = start(backend, &plan, "", |_| {}).await;
        let reply = h.checkout("LONG-1", "3.00").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(models(&reply), [FALLBACK]);
        // Each turn: one 400 from the primary, never retried there; the fallback once.
        assert_eq!(h.model.requests(), 2);
        assert_eq!(fallback.requests(), 2);
        assert_eq!(breakers(&h).await, ["closed", "closed"]);
        assert_eq!(h.db.receipts("LONG-1").await, 1);
    }
);

both_backends!(
    a_content_policy_refusal_is_not_retried_anywhere_and_its_reason_reaches_the_client,
    |backend| async move {
        let plan = format!("replay={ERRORS}/content-policy-violation.http");
        let (h, fallback) = start(backend, &plan, "", |_| {}).await;
        let problem = h.checkout("POLICY-1", "3.00").await.problem(502);
        assert_eq!(problem["code"], "model_error", "{problem}");
        assert_eq!(problem["upstreamStatus"], 400, "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("content_policy_violation: Your request was rejected as a result of our safety system"),
            "{detail}"
        );
        assert_eq!(h.model.requests(), 1, "not retried");
        assert_eq!(fallback.requests(), 0, "not sent elsewhere");
        assert_eq!(h.db.all_receipts().await, 0);
    }
);

both_backends!(
    a_charged_order_whose_confirmation_outlasts_the_loop_timeout_is_confirmed_by_the_service,
    |backend| async move {
        // The fallback never answers round 2: its request timeouts (400 ms each) outlast
        // the loop timeout (1 s) on every loop attempt.
        let (h, _fallback) = start(backend, "503@2", "timeout@2", |s| {
            s.assistant.retry.timeout = Duration::from_millis(1_000);
        })
        .await;
        let reply = h.checkout("SLOW-1", "8.00").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let body = reply.json();
        assert_eq!(body["messageSource"], "service", "{body}");
        assert_eq!(body["attempts"], 3, "the loop retry had its say first");
        assert_eq!(models(&reply), [PRIMARY]);
        assert_eq!(h.db.receipts("SLOW-1").await, 1);
        // Round 1 once (replayed on the retries), round 2 once per loop attempt.
        assert_eq!(h.model.requests(), 4);
    }
);

/// A busy provider is not an outage: one endpoint (no fallback) answering a random 20 %
/// of its requests 503, 400 checkouts at 32 in flight, the default breaker: every one
/// answered 200 with its one receipt, and the breaker never opened (seen failing with
/// the breaker of 0ab22e2, a window of 20 at 50 %: it opened on a burst, and the
/// checkouts of the next 5 s answered 502 "circuit breaker is open").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_failing_a_fifth_of_its_requests_opens_no_breaker_and_fails_no_checkout() {
    let h = Harness::with(Backend::Sqlite, "503%20", |s| {
        s.model.breaker = Settings::default().model.breaker;
        s.model_request.timeout = Duration::from_millis(2_000);
    })
    .await;
    let next = std::sync::atomic::AtomicU32::new(0);
    let worker = || async {
        let mut answers = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= 400 {
                return answers;
            }
            let reply = h.checkout(&format!("BUSY-{i}"), "2.00").await;
            answers.push((reply.status, reply.text()));
        }
    };
    let answers: Vec<_> = futures_util::future::join_all((0..32).map(|_| worker()))
        .await
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(answers.len(), 400);
    let failed: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "{} failed, the first: {:?}",
        failed.len(),
        failed.first()
    );
    assert_eq!(h.db.all_receipts().await, 400);
    assert_eq!(breakers(&h).await, ["closed"]);
    let opened = h.get("/metrics").await.text();
    assert!(
        !opened.contains("checkout_model_breaker_transitions_total"),
        "no transition:\n{opened}"
    );
}
