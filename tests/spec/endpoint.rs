//! POST /checkout through real HTTP, with the scripted model on loopback: the happy path,
//! the repeated charge, the amount conflict, validation, receipts, health, concurrency.

use crate::common::proxy::Proxy;
use crate::common::{Backend, Harness, Reply, TestDb, scripted, test_settings};
use checkout::model::transport::CONNECTIONS;
use serde_json::Value;

fn is_uuid_v7(text: &str) -> bool {
    uuid::Uuid::parse_str(text).is_ok_and(|u| u.get_version_num() == 7)
}

both_backends!(
    happy_path_charges_once_in_two_model_requests,
    |backend| async move {
        let h = Harness::start(backend).await;
        let reply = h.checkout("A-100", "42.50").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.header("content-type"), Some("application/json"));
        let body = reply.json();
        assert_eq!(body["orderId"], "A-100");
        assert_eq!(body["amount"], "42.50");
        assert_eq!(body["currency"], "USD");
        assert_eq!(body["charged"], true);
        assert_eq!(body["attempts"], 1);
        assert!(is_uuid_v7(body["operationKey"].as_str().unwrap()), "{body}");
        let receipt = &body["receipt"];
        assert_eq!(receipt["orderId"], "A-100");
        assert_eq!(receipt["amount"], "42.50");
        assert_eq!(receipt["currency"], "USD");
        let receipt_id = receipt["id"].as_str().unwrap();
        assert!(
            body["message"].as_str().unwrap().contains(receipt_id),
            "{body}"
        );
        assert_eq!(h.db.receipts("A-100").await, 1);
        assert_eq!(h.model.requests(), 2, "one round to charge, one to confirm");
        let stored = h.get("/receipts/A-100").await;
        assert_eq!(stored.status, 200);
        // The receipt as the checkout answered it, and what is refunded of it (nothing).
        let mut stored = stored.json();
        let fields = stored.as_object_mut().unwrap();
        assert_eq!(
            fields.remove("refundedAmount"),
            Some(serde_json::json!("0.00"))
        );
        assert_eq!(fields.remove("refunds"), Some(serde_json::json!([])));
        assert_eq!(stored, *receipt);
    }
);

both_backends!(
    repeated_checkout_returns_the_first_receipt,
    |backend| async move {
        let h = Harness::start(backend).await;
        let first = h.checkout("A-101", "19.99").await.json();
        let second = h.checkout("A-101", "19.99").await;
        assert_eq!(second.status, 200, "{}", second.text());
        let second = second.json();
        assert_eq!(second["charged"], false);
        assert_eq!(second["receipt"], first["receipt"]);
        assert_ne!(second["operationKey"], first["operationKey"]);
        assert_eq!(h.db.receipts("A-101").await, 1);
        assert_eq!(h.model.requests(), 4);
    }
);

both_backends!(
    another_amount_is_409_amount_conflict_and_changes_nothing,
    |backend| async move {
        let h = Harness::start(backend).await;
        let first = h.checkout("A-102", "10.00").await.json();
        let conflict = h.checkout("A-102", "10.01").await;
        let problem = conflict.problem(409);
        assert_eq!(problem["code"], "amount_conflict");
        assert_eq!(problem["receiptId"], first["receipt"]["id"]);
        assert_eq!(problem["chargedAmount"], "10.00");
        assert_eq!(problem["orderCharged"], true);
        assert_eq!(problem["charged"], false);
        assert_eq!(h.db.receipts("A-102").await, 1);
        assert_eq!(h.get("/receipts/A-102").await.json()["amount"], "10.00");
    }
);

#[tokio::test]
async fn amounts_that_floats_get_wrong_are_charged_exactly() {
    let h = Harness::start(Backend::Sqlite).await;
    for (order, amount) in [
        ("F-1", "0.29"),
        ("F-2", "1.15"),
        ("F-3", "19.99"),
        ("F-4", "1000000.00"),
    ] {
        let body = h.checkout(order, amount).await.json();
        assert_eq!(body["receipt"]["amount"], amount, "{body}");
    }
    let count =
        h.db.count(
            "SELECT count(*) FROM receipts WHERE amount_minor IN (29, 115, 1999, 100000000)",
            None,
        )
        .await;
    assert_eq!(count, 4);
}

#[tokio::test]
async fn text_plain_gives_the_confirmation_sentence_alone() {
    let h = Harness::start(Backend::Sqlite).await;
    let reply = h
        .post(
            "/checkout?orderId=T-1&amount=5",
            &[("accept", "text/plain")],
            None,
        )
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    let receipt = h.get("/receipts/T-1").await.json();
    assert_eq!(
        reply.text(),
        format!(
            "Your payment of 5.00 USD for order T-1 went through; your receipt is {}.",
            receipt["id"].as_str().unwrap()
        )
    );
}

/// The order is given once, in the query string: a JSON body (even one that agrees with
/// the query) is refused with 400 naming `body`, and nothing is charged, so a client cannot
/// send an order that says two things. Seen failing, before, with 400 only when the two
/// disagreed (the API document could not say so, and Schemathesis reported it: ST202).
#[tokio::test]
async fn the_order_is_given_once_in_the_query_and_a_body_is_refused() {
    let h = Harness::start(Backend::Sqlite).await;
    let reply = h
        .post("/checkout?orderId=J-1&amount=12.30&currency=EUR", &[], None)
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["receipt"]["currency"], "EUR");
    for body in [
        r#"{"orderId":"J-2","amount":"7"}"#,
        r#"{"orderId":"J-3"}"#,
        "{}",
    ] {
        let reply = h
            .post("/checkout?orderId=J-3&amount=7", &[], Some(body))
            .await;
        let problem = reply.problem(400);
        assert_eq!(problem["field"], "body", "{body}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("reads no body: give the order as query parameters"),
            "{problem}"
        );
    }
    assert_eq!(h.db.all_receipts().await, 1);
    assert_eq!(
        h.model.requests(),
        2,
        "only the first checkout reached the model"
    );
}

/// Every invalid request: 400 problem+json naming the field, no model request, no receipt.
#[tokio::test]
async fn each_invalid_request_is_a_400_naming_the_field_and_charges_nothing() {
    let h = Harness::start(Backend::Sqlite).await;
    let long_id = format!("/checkout?orderId={}&amount=1", "a".repeat(65));
    let no_header: &[(&str, &str)] = &[];
    // (case, path, headers, body, the field the 400 must name)
    let cases = [
        (
            "missing amount",
            "/checkout?orderId=V-1",
            no_header,
            None,
            "amount",
        ),
        (
            "missing order",
            "/checkout?amount=1",
            no_header,
            None,
            "orderId",
        ),
        (
            "malformed amount",
            "/checkout?orderId=V-1&amount=4x",
            no_header,
            None,
            "amount",
        ),
        (
            "negative amount",
            "/checkout?orderId=V-1&amount=-1",
            no_header,
            None,
            "amount",
        ),
        (
            "zero amount",
            "/checkout?orderId=V-1&amount=0.00",
            no_header,
            None,
            "amount",
        ),
        (
            "too precise",
            "/checkout?orderId=V-1&amount=1.001",
            no_header,
            None,
            "amount",
        ),
        (
            "too precise for JPY",
            "/checkout?orderId=V-1&amount=1.5&currency=JPY",
            no_header,
            None,
            "amount",
        ),
        (
            "too large",
            "/checkout?orderId=V-1&amount=1000000.01",
            no_header,
            None,
            "amount",
        ),
        (
            "exponent",
            "/checkout?orderId=V-1&amount=1e3",
            no_header,
            None,
            "amount",
        ),
        (
            "unknown currency",
            "/checkout?orderId=V-1&amount=1&currency=XYZ",
            no_header,
            None,
            "currency",
        ),
        (
            "bad order id",
            "/checkout?orderId=-V&amount=1",
            no_header,
            None,
            "orderId",
        ),
        ("order id too long", &long_id, no_header, None, "orderId"),
        (
            "order id character",
            "/checkout?orderId=V%2F1&amount=1",
            no_header,
            None,
            "orderId",
        ),
        (
            "unknown parameter",
            "/checkout?orderId=V-1&amount=1&ammount=2",
            no_header,
            None,
            "query",
        ),
        (
            "a body",
            "/checkout?orderId=V-1&amount=1",
            no_header,
            Some(r#"{"orderId":"V-1","amount":"1"}"#),
            "body",
        ),
        (
            "bad idempotency key",
            "/checkout?orderId=V-1&amount=1",
            &[("idempotency-key", "\"unterminated")],
            None,
            "Idempotency-Key",
        ),
    ];
    for (name, path, headers, body, field) in cases {
        let reply = h.post(path, headers, body).await;
        let problem = reply.problem(400);
        assert_eq!(problem["code"], "invalid_request", "{name}: {problem}");
        assert_eq!(problem["field"], field, "{name}: {problem}");
        assert_eq!(problem["status"], 400, "{name}");
        assert!(!problem["detail"].as_str().unwrap().is_empty(), "{name}");
    }
    let xml = reqwest::Client::new()
        .post(h.url("/checkout?orderId=V-1&amount=1"))
        .header("content-type", "text/xml")
        .body("<order/>")
        .send()
        .await
        .unwrap();
    assert_eq!(Reply::read(xml).await.problem(400)["field"], "body");
    assert_eq!(
        h.model.requests(),
        0,
        "no invalid request reaches the model"
    );
    assert_eq!(h.db.all_receipts().await, 0);
}

/// A body over `CHECKOUT_BODY_LIMIT_BYTES` (16 KiB by default) is 413
/// `content_too_large` (RFC 9110 §15.5.14) as problem+json, not the 400 of a body within
/// the limit: whitespace, so size is its only difference. Nothing reaches the model or
/// the database. Seen failing as 400 `invalid_request`, "Failed to buffer the request
/// body: length limit exceeded".
#[tokio::test]
async fn a_body_over_the_limit_is_413_content_too_large_and_charges_nothing() {
    let h = Harness::start(Backend::Sqlite).await;
    let padded = " ".repeat(20_000);
    let reply = h
        .post("/checkout?orderId=B-1&amount=1", &[], Some(&padded))
        .await;
    let problem = reply.problem(413);
    assert_eq!(problem["code"], "content_too_large", "{problem}");
    assert_eq!(problem["status"], 413);
    assert_eq!(problem["title"], "The request body is too large");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("CHECKOUT_BODY_LIMIT_BYTES"),
        "{problem}"
    );
    let within = " ".repeat(1_000);
    let reply = h
        .post("/checkout?orderId=B-1&amount=1", &[], Some(&within))
        .await;
    assert_eq!(reply.problem(400)["field"], "body");
    assert_eq!(h.db.all_receipts().await, 0);
    assert_eq!(h.model.requests(), 0);
}

#[tokio::test]
async fn receipts_are_404_until_charged_and_400_for_a_bad_id() {
    let h = Harness::start(Backend::Sqlite).await;
    assert_eq!(
        h.get("/receipts/R-1").await.problem(404)["code"],
        "not_found"
    );
    assert_eq!(
        h.get("/receipts/-bad").await.problem(400)["field"],
        "orderId"
    );
    h.checkout("R-1", "3.00").await;
    assert_eq!(h.get("/receipts/R-1").await.json()["amount"], "3.00");
}

#[tokio::test]
async fn health_says_which_database_and_which_model() {
    let h = Harness::start(Backend::Sqlite).await;
    assert_eq!(h.get("/health/live").await.json()["status"], "live");
    let ready = h.get("/health/ready").await.json();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["database"], "sqlite");
    // The harness points the service at a scripted model of its own, as OPENAI_BASE_URL.
    assert_eq!(ready["model"]["provider"], "openai-compatible");
    assert_eq!(ready["model"]["baseUrl"], h.model.base_url());
}

#[tokio::test]
async fn unknown_paths_and_methods_answer_problem_json() {
    let h = Harness::start(Backend::Sqlite).await;
    assert_eq!(h.get("/nope").await.problem(404)["code"], "not_found");
    let reply = h.get("/checkout").await;
    assert_eq!(reply.problem(405)["code"], "method_not_allowed");
    assert_eq!(reply.header("allow"), Some("POST"));
}

#[tokio::test]
async fn the_openapi_document_describes_every_field_and_error() {
    let h = Harness::start(Backend::Sqlite).await;
    let doc = h.get("/api-docs/openapi.json").await.json();
    assert_eq!(
        doc,
        // The harness serves open (CHECKOUT_AUTH=auto, no key yet).
        serde_json::to_value(checkout::http::openapi(true)).unwrap()
    );
    let post = &doc["paths"]["/checkout"]["post"];
    let params: Vec<&str> = post["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        params,
        [
            "orderId",
            "amount",
            "currency",
            "email",
            "paymentMethod",
            "Idempotency-Key"
        ]
    );
    let statuses: Vec<&str> = post["responses"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        statuses,
        [
            "200", "400", "401", "402", "403", "409", "413", "422", "429", "500", "502", "503",
            "504"
        ]
    );
    // The callers' endpoints name the API key scheme (Swagger UI's Authorize button) and
    // the scope they need, optional while the service is open (`{}`); health does not.
    assert_eq!(
        post["security"],
        serde_json::json!([{"api_key": ["checkout"]}, {}])
    );
    assert_eq!(
        doc["paths"]["/receipts/{orderId}"]["get"]["security"],
        serde_json::json!([{"api_key": ["checkout"]}, {"api_key": ["read"]}, {}])
    );
    assert_eq!(
        doc["paths"]["/health/ready"]["get"]["security"],
        Value::Null
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["api_key"]["scheme"],
        "bearer"
    );
    assert!(post["responses"]["200"]["content"]["text/plain"].is_object());
    assert!(post["responses"]["200"]["content"]["application/json"].is_object());
    // The order is given once: in the query, orderId and amount required there; no body.
    let required: Vec<&str> = post["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["required"] == Value::Bool(true))
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(required, ["orderId", "amount"]);
    assert_eq!(post["requestBody"], Value::Null);
    for path in ["/receipts/{orderId}", "/health/live", "/health/ready"] {
        assert!(doc["paths"][path]["get"].is_object(), "{path}");
    }
    let ui = h.get("/swagger-ui/").await;
    assert_eq!(ui.status, 200);
    assert!(ui.text().contains("swagger"), "{}", ui.text());
}

/// Swagger UI shows each error status with examples of its own codes, not the 400's.
#[test]
fn each_error_status_documents_an_example_of_each_of_its_codes() {
    let doc = serde_json::to_value(checkout::http::openapi(false)).unwrap();
    let responses = &doc["paths"]["/checkout"]["post"]["responses"];
    for (status, codes) in [
        ("400", &["invalid_request"][..]),
        ("401", &["unauthorized"]),
        ("402", &["payment_declined", "payment_requires_action"]),
        ("409", &["amount_conflict", "in_flight"]),
        ("422", &["key_reuse"]),
        (
            "502",
            &["model_did_not_charge", "model_error", "provider_error"],
        ),
        ("429", &["rate_limited"]),
        ("503", &["overloaded", "unavailable"]),
        ("504", &["deadline_exceeded"]),
    ] {
        let examples = responses[status]["content"]["application/problem+json"]["examples"]
            .as_object()
            .unwrap_or_else(|| panic!("{status} has no examples"));
        assert_eq!(examples.keys().collect::<Vec<_>>(), codes, "{status}");
        for (code, example) in examples {
            assert_eq!(example["value"]["code"], code.as_str(), "{status}");
            assert_eq!(example["value"]["status"].to_string(), status, "{status}");
        }
    }
}

/// The served OpenAPI document is pinned in `tests/snapshots/openapi.json`: a change to
/// the HTTP contract shows here as a diff, to be read and then committed.
#[tokio::test]
async fn the_served_openapi_document_matches_its_snapshot() {
    const SNAPSHOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/openapi.json");
    let h = Harness::start(Backend::Sqlite).await;
    let served = h.get("/api-docs/openapi.json").await.json();
    let served = serde_json::to_string_pretty(&served).unwrap() + "\n";
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(SNAPSHOT, &served).unwrap();
    }
    let pinned = std::fs::read_to_string(SNAPSHOT).unwrap_or_default();
    if served != pinned {
        panic!(
            "/api-docs/openapi.json differs from {SNAPSHOT} (- pinned, + served):\n{}\nIf the change is meant, update the snapshot and commit it:\n    UPDATE_SNAPSHOTS=1 cargo test --test spec the_served_openapi_document_matches_its_snapshot",
            line_diff(&pinned, &served)
        );
    }
}

/// The lines between the common head and the common tail of two texts, with 3 lines of
/// context: enough to read one change to a document.
fn line_diff(old: &str, new: &str) -> String {
    let (old, new): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let head = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
    let tail = old[head..]
        .iter()
        .rev()
        .zip(new[head..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let context = head.saturating_sub(3);
    let mut diff = String::new();
    for line in &old[context..head] {
        diff += &format!("  {line}\n");
    }
    for line in &old[head..old.len() - tail] {
        diff += &format!("- {line}\n");
    }
    for line in &new[head..new.len() - tail] {
        diff += &format!("+ {line}\n");
    }
    for line in new[new.len() - tail..].iter().take(3) {
        diff += &format!("  {line}\n");
    }
    diff
}

both_backends!(
    fifty_concurrent_checkouts_of_one_order_make_one_receipt,
    |backend| async move {
        let h = std::sync::Arc::new(Harness::start(backend).await);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let h = h.clone();
            tasks.spawn(async move { h.checkout("RACE-1", "7.77").await });
        }
        let mut receipt_ids = std::collections::HashSet::new();
        let mut charged = 0;
        while let Some(reply) = tasks.join_next().await {
            let reply = reply.unwrap();
            assert_eq!(reply.status, 200, "{}", reply.text());
            let body = reply.json();
            receipt_ids.insert(body["receipt"]["id"].as_str().unwrap().to_owned());
            charged += usize::from(body["charged"] == true);
        }
        assert_eq!(receipt_ids.len(), 1, "every answer carries the one receipt");
        assert_eq!(charged, 1, "exactly one answer made the charge");
        assert_eq!(h.db.receipts("RACE-1").await, 1);
    }
);

/// HTTP/2 both ways: a client that speaks it without TLS (as a load balancer may) gets
/// its answer over HTTP/2, and with CHECKOUT_MODEL_H2C the model requests go over HTTP/2
/// too. The charge is the same: one receipt, two model requests.
#[tokio::test]
async fn http2_to_the_service_and_to_the_model_charges_once() {
    let h = Harness::with(Backend::Sqlite, "", |s| s.model.h2c = true).await;
    let http2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let response = http2
        .post(h.url("/checkout?orderId=H2-1&amount=3.50"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let reply = Reply::read(response).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["charged"], true);
    assert_eq!(h.db.receipts("H2-1").await, 1);
    assert_eq!(h.model.requests(), 2);
    assert_eq!(h.model.requests_over_http2(), 2);
}

/// Over h2c the model requests go over [`CONNECTIONS`] connections in turn, each kept for
/// the next (a reqwest client keeps one per host, and a provider limits the streams on
/// one): four checkouts, eight requests, four connections (seen failing with one client:
/// one connection).
#[tokio::test]
async fn model_requests_over_http2_take_turns_on_four_kept_connections() {
    let h = Harness::with(Backend::Sqlite, "", |s| s.model.h2c = true).await;
    for i in 1..=4 {
        let reply = h.checkout(&format!("H2C-{i}"), "1.00").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(h.model.requests_over_http2(), 8);
    assert_eq!(CONNECTIONS, 4);
    assert_eq!(h.model.connections(), 4);
}

/// Eight checkouts one after the other, with the model behind a proxy that cuts every
/// model connection after the fourth (the model server restarted): each answered 200
/// after two model requests, none repeated. Returns the connections the model saw before
/// the cut and in all.
async fn checkouts_across_a_model_restart(h2c: bool) -> (u64, u64, Harness) {
    let db = TestDb::new(Backend::Sqlite).await;
    let model = scripted("").await;
    let proxy = Proxy::start(model.addr()).await;
    let mut settings = test_settings(&db, &model);
    settings.model.base_url = Some(format!("http://{}/v1", proxy.addr));
    settings.model.h2c = h2c;
    let h = Harness::serve(db, model, settings).await;
    let mut before = 0;
    for i in 1..=8 {
        if i == 5 {
            before = h.model.connections();
            proxy.down();
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            proxy.up();
        }
        let reply = h.checkout(&format!("R-{i}"), "1.00").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["usage"]["modelRequests"], 2);
    }
    assert_eq!(h.model.requests(), 16);
    (before, h.model.connections(), h)
}

/// A model connection over h2c that closes (the model server restarted) is made again
/// for the next request, which goes out once: four checkouts make the four connections,
/// the cut closes them, and four more checkouts make four new ones (seen failing with
/// connections never made again: 502 after the cut).
#[tokio::test]
async fn model_connections_over_http2_that_close_are_made_again() {
    let (before, all, h) = checkouts_across_a_model_restart(true).await;
    assert_eq!(h.model.requests_over_http2(), 16);
    assert_eq!((before, all), (4, 8));
}

/// Over HTTP/1.1 a model connection is kept for the next request: four checkouts one
/// after the other, eight requests, one connection; after the cut, the next request makes
/// a new one and goes out once (seen failing with connections never given back: eight
/// connections before the cut; and with closed ones never made again: three requests).
#[tokio::test]
async fn model_connections_over_http1_are_kept_and_made_again_when_closed() {
    let (before, all, h) = checkouts_across_a_model_restart(false).await;
    assert_eq!(h.model.requests_over_http2(), 0);
    assert_eq!((before, all), (1, 2));
}

/// Without CHECKOUT_MODEL_H2C a plain http:// model is spoken to in HTTP/1.1, which every
/// OpenAI-compatible server takes.
#[tokio::test]
async fn the_model_is_asked_over_http1_by_default() {
    let h = Harness::start(Backend::Sqlite).await;
    assert_eq!(h.checkout("H1-1", "3.50").await.status, 200);
    assert_eq!(h.model.requests(), 2);
    assert_eq!(h.model.requests_over_http2(), 0);
}

/// A client that goes away leaves its checkout running to its end: the request's future
/// is dropped, and the work it was polling goes on in a task of its own (seen failing
/// without that hand-over: no receipt after 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_whose_client_goes_away_runs_on_to_its_one_charge() {
    // Each answer takes 300 ms; the client gives up after 100 ms, in the first round.
    let h = Harness::with(Backend::Sqlite, "slow=300", |_| {}).await;
    let sent = h
        .http
        .post(h.url("/checkout?orderId=GONE-1&amount=5"))
        .send();
    let gone = tokio::time::timeout(std::time::Duration::from_millis(100), sent).await;
    assert!(gone.is_err(), "the client gave up before the answer");
    let mut receipts = 0;
    for _ in 0..50 {
        receipts = h.db.receipts("GONE-1").await;
        if receipts == 1 && h.model.requests() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(receipts, 1);
    assert_eq!(h.model.requests(), 2);
    let receipt = h.get("/receipts/GONE-1").await;
    assert_eq!(receipt.json()["amount"], "5.00", "{}", receipt.text());
}
