//! The confirmation email: with an `email` in the request the assistant may send the
//! customer one confirmation per operation. One outbox row per operation, whatever is
//! retried; the message goes to a real SMTP server (maildev for the happy path, an
//! aiosmtpd server that fails on purpose for the faults) with a Message-ID derived from
//! the operation key, so a repeat delivery is recognisably the same message.

use std::collections::HashSet;
use std::time::Duration;

use checkout::config::Settings;
use checkout::secret::Secret;
use serde_json::Value;

use crate::common::smtp::{FaultySmtp, Maildev};
use crate::common::{Backend, Harness, Reply, TestDb, until};

const EMAIL: &str = "ann@example.com";

/// Sends mail to `url`, retrying transient failures quickly.
fn smtp(url: String) -> impl FnOnce(&mut Settings) {
    move |s| {
        s.mail.smtp_url = Some(Secret::new(url));
        s.mail.backoff_min = Duration::from_millis(20);
        s.mail.backoff_max = Duration::from_millis(100);
    }
}

async fn checkout(h: &Harness, order: &str, key: &str) -> Reply {
    h.post(
        &format!("/checkout?orderId={order}&amount=42.50&email={EMAIL}"),
        &[("Idempotency-Key", key)],
        None,
    )
    .await
}

/// The operation's outbox rows.
async fn rows(db: &TestDb, key: &str) -> i64 {
    db.count(
        "SELECT count(*) FROM outbox WHERE operation_key = $1",
        Some(key),
    )
    .await
}

/// The operation's outbox rows marked sent.
async fn sent(db: &TestDb, key: &str) -> i64 {
    db.count(
        "SELECT count(*) FROM outbox WHERE operation_key = $1 AND status = 'sent'",
        Some(key),
    )
    .await
}

/// The answer's confirmation: queued or sent, and its Message-ID.
fn message_id(reply: &Reply) -> String {
    let body = reply.json();
    let confirmation = &body["confirmation"];
    let status = confirmation["status"].as_str().unwrap_or_default();
    assert!(
        status == "queued" || status == "sent",
        "confirmation: {body}"
    );
    confirmation["messageId"].as_str().unwrap().to_owned()
}

/// How many of maildev's messages carry `id`.
fn deliveries(messages: &[Value], id: &str) -> usize {
    messages
        .iter()
        .filter(|m| m["headers"]["message-id"].as_str() == Some(id))
        .count()
}

both_backends!(
    a_bad_email_is_refused_naming_the_field_and_nothing_is_charged,
    |backend| async move {
        let h = Harness::start(backend).await;
        let long = format!("{}@example.com", "a".repeat(243));
        assert_eq!(long.len(), 255);
        let cases: [(String, Option<&str>); 5] = [
            ("/checkout?orderId=E-1&amount=1&email=ann".into(), None),
            (format!("/checkout?orderId=E-1&amount=1&email={long}"), None),
            (
                "/checkout?orderId=E-1&amount=1&email=Ann%20%3Cann%40example.com%3E".into(),
                None,
            ),
            (
                "/checkout?orderId=E-1&amount=1&email=ann@example.com".into(),
                Some(r#"{"email": "bob@example.com"}"#),
            ),
            (
                "/checkout".into(),
                Some(
                    r#"{"orderId": "E-1", "amount": "1", "email": "ann@example.com,bob@example.com"}"#,
                ),
            ),
        ];
        for (path, body) in cases {
            let reply = h.post(&path, &[], body).await;
            let problem = reply.problem(400);
            assert_eq!(problem["code"], "invalid_request", "{path}");
            assert_eq!(problem["field"], "email", "{path}: {problem}");
        }
        assert_eq!(h.db.all_receipts().await, 0);
        assert_eq!(
            h.db.count("SELECT count(*) FROM outbox", None).await,
            0,
            "no outbox row"
        );
        assert_eq!(h.model.requests(), 0, "the model was not asked");
    }
);

both_backends!(
    without_an_email_the_assistant_has_no_confirmation_tool,
    |backend| async move {
        let h = Harness::start(backend).await;
        let reply = h
            .post(
                "/checkout?orderId=N-1&amount=2",
                &[("Idempotency-Key", "n-1")],
                None,
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let body = reply.json();
        assert!(body.get("confirmation").is_none(), "{body}");
        // Charge, then the sentence: two rounds; with an email, three (the confirmation).
        assert_eq!(body["usage"]["modelRequests"], 2);
        assert_eq!(rows(&h.db, "n-1").await, 0);
        let reply = checkout(&h, "N-2", "n-2").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["usage"]["modelRequests"], 3);
        assert_eq!(rows(&h.db, "n-2").await, 1);
    }
);

both_backends!(
    without_smtp_each_operation_writes_one_eml_file,
    |backend| async move {
        let h = Harness::start(backend).await;
        let first = checkout(&h, "F-1", "f-1").await;
        assert_eq!(first.status, 200, "{}", first.text());
        let second = checkout(&h, "F-2", "f-2").await;
        assert_eq!(second.status, 200, "{}", second.text());
        // The client's retry of the first: its saved answer, no new row, no new file.
        let again = checkout(&h, "F-1", "f-1").await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        let ids = [message_id(&first), message_id(&second)];
        for (key, id) in [("f-1", &ids[0]), ("f-2", &ids[1])] {
            until("the message is written", async || {
                sent(&h.db, key).await == 1
            })
            .await;
            assert_eq!(rows(&h.db, key).await, 1);
            let file =
                h.db.mail_dir
                    .path()
                    .join(format!("{}.eml", id.trim_matches(['<', '>'])));
            let text = std::fs::read_to_string(&file).expect("the .eml file");
            assert!(text.contains(&format!("Message-ID: {id}")), "{text}");
            assert!(text.contains(&format!("To: {EMAIL}")), "{text}");
        }
        let files = std::fs::read_dir(h.db.mail_dir.path()).unwrap().count();
        assert_eq!(files, 2, "one .eml file per operation");
        assert_ne!(ids[0], ids[1]);
    }
);

both_backends!(
    maildev_receives_one_confirmation_rendered_from_the_receipt,
    |backend| async move {
        let maildev = Maildev::start().await;
        let h = Harness::with(backend, "", smtp(maildev.url())).await;
        let reply = checkout(&h, "M-1", "m-1").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let id = message_id(&reply);
        let receipt = reply.json()["receipt"]["id"].as_str().unwrap().to_owned();
        until("maildev has the message", async || {
            deliveries(&maildev.messages().await, &id) == 1
        })
        .await;
        until("the row is sent", async || sent(&h.db, "m-1").await == 1).await;
        // The client's retry with the same key, and another operation on the same order
        // (which finds the charge another operation made, so its confirmation is not
        // this operation's to send): nothing more is written or sent.
        let again = checkout(&h, "M-1", "m-1").await;
        assert_eq!(again.body, reply.body, "the saved answer");
        let other = checkout(&h, "M-1", "m-1-other").await;
        assert_eq!(other.status, 200, "{}", other.text());
        assert_eq!(other.json()["charged"], false);
        assert!(
            other.json().get("confirmation").is_none(),
            "{}",
            other.text()
        );
        assert_eq!(h.db.receipts("M-1").await, 1);
        assert_eq!(rows(&h.db, "m-1").await, 1);
        assert_eq!(rows(&h.db, "m-1-other").await, 0);
        let messages = maildev.messages().await;
        assert_eq!(messages.len(), 1, "{messages:#?}");
        let message = &messages[0];
        assert_eq!(message["headers"]["message-id"], id.as_str());
        assert_eq!(message["envelope"]["to"][0]["address"], EMAIL);
        assert_eq!(message["subject"], "Payment confirmed: order M-1");
        let text = message["text"].as_str().unwrap();
        assert!(text.contains("42.50 USD"), "{text}");
        assert!(text.contains(&receipt), "{text}");
    }
);

// Faults of the loop-retry matrix, each on its own order and key, journal on or off:
// each operation has one outbox row and maildev one message with its Message-ID.
both_backends!(
    loop_retries_leave_one_row_and_one_message_per_operation,
    |backend| async move {
        let maildev = Maildev::start().await;
        let cases = [
            // The confirmation's own round times out past its request retries.
            ("timeout@2x3", true),
            // The sentence after the confirmation does: the loop retry replays the
            // confirmation's result (journal) or runs the tool again (journal off).
            ("timeout@3x3", true),
            ("timeout@3x3", false),
            ("503@3x3", false),
            ("close@3x3", true),
            // Two confirmation calls in one answer; a confirmation before the charge.
            ("double-confirm@2x1", true),
            ("confirm-first@1x1", true),
        ];
        let mut ids = Vec::new();
        for (i, (faults, journal)) in cases.into_iter().enumerate() {
            let tune = smtp(maildev.url());
            let h = Harness::with(backend, faults, |s| {
                tune(s);
                s.r#loop.journal = journal;
            })
            .await;
            let key = format!("l-{i}");
            let reply = checkout(&h, &format!("L-{i}"), &key).await;
            assert_eq!(reply.status, 200, "{faults}: {}", reply.text());
            assert_eq!(h.db.all_receipts().await, 1, "{faults}");
            assert_eq!(rows(&h.db, &key).await, 1, "{faults}: one outbox row");
            until("the row is sent", async || sent(&h.db, &key).await == 1).await;
            ids.push((faults, message_id(&reply)));
        }
        let messages = maildev.messages().await;
        for (faults, id) in &ids {
            assert_eq!(deliveries(&messages, id), 1, "{faults}: {messages:#?}");
        }
        assert_eq!(messages.len(), ids.len());
    }
);

both_backends!(
    a_lost_acknowledgement_is_delivered_again_with_the_same_message_id,
    |backend| async move {
        let server = FaultySmtp::start(&["--drop", "1"]);
        let h = Harness::with(backend, "", smtp(server.url())).await;
        let reply = checkout(&h, "D-1", "d-1").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let id = message_id(&reply);
        until("the row is sent", async || sent(&h.db, "d-1").await == 1).await;
        assert_eq!(server.outcomes(), ["dropped", "accepted"]);
        let ids: HashSet<String> = server
            .received()
            .iter()
            .map(|m| m["message_id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(ids, HashSet::from([id]), "one distinct Message-ID");
        assert_eq!(rows(&h.db, "d-1").await, 1);
        let metrics = h.get("/metrics").await.text();
        for line in [
            "checkout_emails_total{result=\"retried\"} 1",
            "checkout_emails_total{result=\"sent\"} 1",
            "checkout_emails_total{result=\"failed\"} 0",
        ] {
            assert!(metrics.contains(line), "{line} in {metrics}");
        }
    }
);

both_backends!(
    a_4xx_is_retried_and_the_message_delivered_once,
    |backend| async move {
        let server = FaultySmtp::start(&["--tempfail", "1"]);
        let h = Harness::with(backend, "", smtp(server.url())).await;
        let reply = checkout(&h, "T-1", "t-1").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let id = message_id(&reply);
        until("the row is sent", async || sent(&h.db, "t-1").await == 1).await;
        assert_eq!(server.outcomes(), ["tempfail", "accepted"]);
        assert!(
            server
                .received()
                .iter()
                .all(|m| m["message_id"] == id.as_str())
        );
        assert_eq!(
            h.db.count(
                "SELECT count(*) FROM outbox WHERE operation_key = $1 AND attempts = 2",
                Some("t-1")
            )
            .await,
            1,
            "two attempts"
        );
    }
);

both_backends!(
    a_5xx_is_recorded_failed_and_not_sent_again,
    |backend| async move {
        let server = FaultySmtp::start(&["--permfail"]);
        let h = Harness::with(backend, "", smtp(server.url())).await;
        let reply = checkout(&h, "P-1", "p-1").await;
        // The order is charged whatever becomes of its email.
        assert_eq!(reply.status, 200, "{}", reply.text());
        until("the row is failed", async || {
            h.db.count(
                "SELECT count(*) FROM outbox WHERE operation_key = $1 AND status = 'failed' \
                 AND attempts = 1 AND last_error LIKE '%550%'",
                Some("p-1"),
            )
            .await
                == 1
        })
        .await;
        assert_eq!(server.outcomes(), ["permfail"]);
        let metrics = h.get("/metrics").await.text();
        assert!(
            metrics.contains("checkout_emails_total{result=\"failed\"} 1"),
            "{metrics}"
        );
    }
);
