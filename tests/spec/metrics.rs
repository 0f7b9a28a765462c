//! `GET /metrics`: a run of checkouts through the scripted model — a request retry after a
//! 503, a request timeout, a charge found rather than made, an amount conflict, an invalid
//! request, and Idempotency-Keys new, replayed, in flight and reused — and the exact
//! counts the scrape must show for it.

use std::time::Duration;

use crate::common::{Backend, Harness, sample};
use checkout::model::scripted::FaultRule;

fn faults(plan: &str) -> Vec<FaultRule> {
    FaultRule::parse_plan(plan).expect("a valid fault plan")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrape_counts_exactly_the_checkouts_retries_timeouts_and_keys_made() {
    // The first request of round 1 is answered 503 once: the request retry repeats it.
    // A request timeout of 1 s, well above the 500 ms of the slow answer below.
    let h = Harness::with(Backend::Sqlite, "503@1x1", |s| {
        s.model_request.timeout = Duration::from_millis(1_000)
    })
    .await;

    // one request retry (503), charged, confirmed: 3 model requests, 2 rounds.
    assert_eq!(h.checkout("A-1", "10.00").await.status, 200);
    assert_eq!(h.model.requests(), 3);

    // A-2 under a key: new; the same again: replayed, the loop does not run.
    let key = [("Idempotency-Key", "\"k-2\"")];
    let first = h.post("/checkout?orderId=A-2&amount=5", &key, None).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let again = h.post("/checkout?orderId=A-2&amount=5", &key, None).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    // The same key for another order: key_reuse, nothing runs.
    let reused = h.post("/checkout?orderId=A-3&amount=5", &key, None).await;
    assert_eq!(reused.problem(422)["code"], "key_reuse");
    // A-2 again without a key: a new operation; its charge is found, not made.
    let found = h.checkout("A-2", "5").await;
    assert_eq!(found.json()["charged"], false, "{}", found.text());
    // A-1 for another amount: the charge call meets the receipt, amount_conflict, 1 round.
    assert_eq!(
        h.checkout("A-1", "11").await.problem(409)["code"],
        "amount_conflict"
    );
    // Refused before anything runs.
    assert_eq!(
        h.checkout("A-4", "abc").await.problem(400)["code"],
        "invalid_request"
    );
    assert_eq!(h.model.requests(), 8);

    // round 1 hangs once, the request timeout (1 s) cuts it off, the retry mends it.
    h.model.set_faults(faults("timeout@1x1"));
    assert_eq!(h.checkout("A-5", "7").await.status, 200);
    assert_eq!(h.model.requests(), 11);

    // A-6 under a key, its first request slow; the same key meanwhile is in flight.
    h.model.set_faults(faults("slow=500@1x1"));
    let slow = {
        let (http, url) = (h.http.clone(), h.url("/checkout?orderId=A-6&amount=3"));
        tokio::spawn(async move {
            crate::common::post(&http, &url, &[("Idempotency-Key", "k-6")], None).await
        })
    };
    while h.model.requests() < 12 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let meanwhile = h
        .post(
            "/checkout?orderId=A-6&amount=3",
            &[("Idempotency-Key", "k-6")],
            None,
        )
        .await;
    assert_eq!(meanwhile.problem(409)["code"], "in_flight");
    assert_eq!(slow.await.unwrap().status, 200);
    assert_eq!(h.model.requests(), 13);

    let scrape = h.get("/metrics").await;
    assert_eq!(scrape.status, 200);
    assert_eq!(
        scrape.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = scrape.text();
    let expect = [
        // found, A-5, A-6.
        ("checkout_checkouts_total{code=\"ok\"}", Some(5.0)),
        (
            "checkout_checkouts_total{code=\"amount_conflict\"}",
            Some(1.0),
        ),
        (
            "checkout_checkouts_total{code=\"invalid_request\"}",
            Some(1.0),
        ),
        ("checkout_checkouts_total{code=\"key_reuse\"}", None),
        ("checkout_charges_total{result=\"created\"}", Some(4.0)),
        ("checkout_charges_total{result=\"found\"}", Some(1.0)),
        (
            "checkout_retries_total{layer=\"request\",reason=\"http_503\"}",
            Some(1.0),
        ),
        (
            "checkout_retries_total{layer=\"request\",reason=\"timeout\"}",
            Some(1.0),
        ),
        ("checkout_retry_budget_refusals_total", Some(0.0)),
        ("checkout_timeouts_total{layer=\"request\"}", Some(1.0)),
        ("checkout_timeouts_total{layer=\"loop\"}", Some(0.0)),
        ("checkout_timeouts_total{layer=\"server\"}", Some(0.0)),
        (
            "checkout_idempotency_keys_total{outcome=\"new\"}",
            Some(2.0),
        ),
        (
            "checkout_idempotency_keys_total{outcome=\"replay\"}",
            Some(1.0),
        ),
        (
            "checkout_idempotency_keys_total{outcome=\"in_flight\"}",
            Some(1.0),
        ),
        (
            "checkout_idempotency_keys_total{outcome=\"key_reuse\"}",
            Some(1.0),
        ),
        // Runs of the loop: five of 2 rounds, the conflict's of 1.
        ("checkout_loop_rounds_count", Some(6.0)),
        ("checkout_loop_rounds_sum", Some(11.0)),
        ("checkout_loop_rounds_bucket{le=\"1\"}", Some(1.0)),
        ("checkout_loop_rounds_bucket{le=\"2\"}", Some(6.0)),
    ];
    for (series, value) in expect {
        assert_eq!(sample(&text, series), value, "{series}\n{text}");
    }
    assert!(
        !text.contains("layer=\"loop\",reason"),
        "no loop retry ran: {text}"
    );

    // The model: 13 requests, 11 answered, one 503, one cut off by the request timeout.
    let chat = "gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"openai\",gen_ai_request_model=\"gpt-4o-mini\"";
    let duration = "gen_ai_client_operation_duration_seconds_count";
    assert_eq!(
        sample(&text, &format!("{duration}{{{chat}}}")),
        Some(11.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!("{duration}{{{chat},error_type=\"http_503\"}}")
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!("{duration}{{{chat},error_type=\"timeout\"}}")
        ),
        Some(1.0),
        "{text}"
    );
    let timed_out = sample(
        &text,
        &format!("gen_ai_client_operation_duration_seconds_sum{{{chat},error_type=\"timeout\"}}"),
    )
    .unwrap();
    assert!(
        (1.0..3.0).contains(&timed_out),
        "the timeout is 1 s: {timed_out}"
    );
    let (input, output) = h.model.tokens();
    assert!(input > output && output > 0, "{input} {output}");
    for (kind, tokens) in [("input", input), ("output", output)] {
        let series = |part: &str| {
            format!("gen_ai_client_token_usage_{part}{{{chat},gen_ai_token_type=\"{kind}\"}}")
        };
        assert_eq!(
            sample(&text, &series("count")),
            Some(11.0),
            "{kind}: {text}"
        );
        assert_eq!(
            sample(&text, &series("sum")),
            Some(tokens as f64),
            "{kind}: {text}"
        );
    }

    // No client-chosen value is a label.
    for secret in ["A-1", "A-2", "A-6", "k-2", "k-6", "127.0.0.1"] {
        assert!(!text.contains(secret), "{secret} in the scrape: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_is_described_and_the_endpoint_is_in_the_api_document() {
    // One request retry, so that the retry counter has a series too.
    let h = Harness::with(Backend::Sqlite, "503@1x1", |_| {}).await;
    assert_eq!(h.checkout("B-1", "1").await.status, 200);
    let text = h.get("/metrics").await.text();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split(' ').next())
        .collect();
    // 17 with the model breaker's state, a gauge set at start (docs/outage.md); 21 with
    // the approvals' three and the budgets' refusals (main's HEAD counted 21 where this
    // said 17); 22 with the refunds' outcomes (their amount has a series once a refund is
    // made); 25 with the webhooks' deliveries, events pending and the oldest's age.
    assert_eq!(
        names.len(),
        25,
        "the checkout_* and gen_ai_* metrics: {names:?}"
    );
    for name in names {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} has no HELP"
        );
    }
    let api = h.get("/api-docs/openapi.json").await.json();
    assert!(api["paths"]["/metrics"]["get"].is_object(), "{api}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_timeout_and_a_server_timeout_are_counted_by_their_layer() {
    // Every answer takes 300 ms (under the 400 ms request timeout), and the loop timeout
    // is 250 ms, with no loop retry: the loop is cut in its first round, before the charge
    // (after it, the paid order would be a 200).
    let h = Harness::with(Backend::Sqlite, "slow=300", |s| {
        s.assistant.retry.timeout = Duration::from_millis(250);
        s.assistant.retry.max_retries = 0;
    })
    .await;
    let reply = h.checkout("C-1", "1").await;
    assert_eq!(
        reply.problem(504)["layer"],
        "loop timeout",
        "{}",
        reply.text()
    );
    let text = h.get("/metrics").await.text();
    assert_eq!(
        sample(&text, "checkout_timeouts_total{layer=\"loop\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "checkout_timeouts_total{layer=\"server\"}"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "checkout_timeouts_total{layer=\"request\"}"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "checkout_checkouts_total{code=\"deadline_exceeded\"}"
        ),
        Some(1.0),
        "{text}"
    );
    // The run cut off had reached its first round.
    assert_eq!(
        sample(&text, "checkout_loop_rounds_count"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "checkout_loop_rounds_sum"),
        Some(1.0),
        "{text}"
    );

    // The server timeout (150 ms) gives up on the HTTP request; the checkout runs on.
    let h = Harness::with(Backend::Sqlite, "slow=300", |s| {
        s.server.timeout = Duration::from_millis(150);
    })
    .await;
    assert_eq!(
        h.checkout("C-2", "1").await.problem(504)["code"],
        "deadline_exceeded"
    );
    let text = h.get("/metrics").await.text();
    assert_eq!(
        sample(&text, "checkout_timeouts_total{layer=\"server\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "checkout_timeouts_total{layer=\"loop\"}"),
        Some(0.0),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loop_retries_and_retry_budget_refusals_are_counted_apart_from_request_retries() {
    // Three 503s in a row spend the request retry (1 + 2 retries); the loop retry runs the
    // loop again, and its second attempt goes through.
    let h = Harness::with(Backend::Sqlite, "503@1x3", |_| {}).await;
    let reply = h.checkout("D-1", "1").await;
    assert_eq!(reply.json()["attempts"], 2, "{}", reply.text());
    let text = h.get("/metrics").await.text();
    let retries = |layer: &str, reason: &str| {
        sample(
            &text,
            &format!("checkout_retries_total{{layer=\"{layer}\",reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(retries("request", "http_503"), Some(2.0), "{text}");
    assert_eq!(retries("loop", "model"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "checkout_retry_budget_refusals_total"),
        Some(0.0)
    );

    // An empty retry budget refuses the request retry: counted as a refusal, not a retry.
    let h = Harness::with(Backend::Sqlite, "503@1x1", |s| {
        s.model_request.budget_percent = 0;
        s.model_request.budget_min_per_sec = 0;
    })
    .await;
    let reply = h.checkout("D-2", "1").await;
    assert_eq!(
        reply.problem(502)["code"],
        "model_error",
        "{}",
        reply.text()
    );
    let text = h.get("/metrics").await.text();
    assert_eq!(
        sample(&text, "checkout_retry_budget_refusals_total"),
        Some(1.0),
        "{text}"
    );
    assert!(
        !text.contains("checkout_retries_total{"),
        "no retry was made: {text}"
    );
    assert_eq!(
        sample(&text, "checkout_checkouts_total{code=\"model_error\"}"),
        Some(1.0),
        "{text}"
    );
}
