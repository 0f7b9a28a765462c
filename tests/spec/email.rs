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
use crate::common::{
    Backend, Harness, Process, Reply, TestDb, client, post, scripted, settled, until,
};
use checkout::model::scripted::FaultRule;

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
                "/checkout?orderId=E-1&amount=1&email=ann@example.com,bob@example.com".into(),
                None,
            ),
            (
                "/checkout?orderId=E-1&amount=1&email=ann@@example.com".into(),
                None,
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
                s.assistant.journal = journal;
            })
            .await;
            let key = format!("l-{i}");
            let reply = checkout(&h, &format!("L-{i}"), &key).await;
            assert_eq!(reply.status, 200, "{faults}: {}", reply.text());
            assert_eq!(h.db.all_receipts().await, 1, "{faults}");
            assert_eq!(
                rows(&h.db, &key).await,
                1,
                "{faults}, journal {journal}: one outbox row"
            );
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

/// An operation's request from a real process, by its Idempotency-Key.
async fn checkout_at(at: &Process, order: &str, key: &str) -> Reply {
    post(
        &client(),
        &at.url(&format!(
            "/checkout?orderId={order}&amount=42.50&email={EMAIL}"
        )),
        &[("Idempotency-Key", key)],
        None,
    )
    .await
}

both_backends!(
    sigkill_after_the_charge_and_before_the_send_the_sweep_of_another_instance_sends_it_once,
    |backend| async move {
        let db = TestDb::new(backend).await;
        // The confirmation's round never answers: the instance is killed in it.
        let model = scripted("timeout@2").await;
        let mail = tempfile::tempdir().unwrap();
        let base_url = model.base_url();
        let env = [
            ("DATABASE_URL", db.url.as_str()),
            ("OPENAI_BASE_URL", base_url.as_str()),
            ("CHECKOUT_MAIL_DIR", mail.path().to_str().unwrap()),
            ("CHECKOUT_IDEMPOTENCY_LEASE_MS", "1000"),
        ];
        let mut victim = Process::start(&env);
        let lost = {
            let url = victim.url(&format!("/checkout?orderId=K-1&amount=42.50&email={EMAIL}"));
            // Its answer is lost with the victim.
            let request = client().post(url).header("Idempotency-Key", "k-1");
            tokio::spawn(async move { request.send().await.is_ok() })
        };
        until(
            "the order is charged and the confirmation asked for",
            async || db.receipts("K-1").await == 1 && model.requests_at_round(2) >= 1,
        )
        .await;
        victim.signal("KILL");
        victim.wait(Duration::from_secs(10));
        lost.abort();
        assert_eq!(rows(&db, "k-1").await, 0, "killed before the send");
        model.set_faults(Vec::new());
        // Nobody retries: the sweep of the live instance resumes the operation.
        let survivor = Process::start(&env);
        until("the confirmation is sent", async || {
            sent(&db, "k-1").await == 1
        })
        .await;
        // The sweep took it over once (a new fence, as a client's retry would take).
        assert_eq!(
            db.count(
                "SELECT count(*) FROM idempotency_keys WHERE key = $1 AND recoveries = 1 AND fence = 2",
                Some("k-1"),
            )
            .await,
            1
        );
        assert_eq!(db.receipts("K-1").await, 1);
        assert_eq!(rows(&db, "k-1").await, 1);
        let files: Vec<_> = std::fs::read_dir(mail.path()).unwrap().collect();
        assert_eq!(files.len(), 1, "one .eml file");
        // The client's retry finds the answer the sweep saved (once the sweep, which
        // sent the message before its model's last answer, has saved it).
        let retry = settled(async || checkout_at(&survivor, "K-1", "k-1").await).await;
        assert_eq!(retry.status, 200, "{}", retry.text());
        assert_eq!(retry.header("idempotent-replayed"), Some("true"));
        assert_eq!(retry.json()["charged"], true);
        let id = message_id(&retry);
        let name = files[0].as_ref().unwrap().file_name();
        assert_eq!(
            name.to_str().unwrap(),
            format!("{}.eml", id.trim_matches(['<', '>']))
        );
    }
);

both_backends!(
    sigkill_after_the_server_accepted_and_before_the_row_was_marked_delivers_again_with_the_same_message_id,
    |backend| async move {
        let db = TestDb::new(backend).await;
        let model = scripted("").await;
        // The first message is kept and never acknowledged; the instance dies waiting.
        let server = FaultySmtp::start(&["--hold", "1"]);
        let (base_url, smtp) = (model.base_url(), server.url());
        let env = [
            ("DATABASE_URL", db.url.as_str()),
            ("OPENAI_BASE_URL", base_url.as_str()),
            ("CHECKOUT_SMTP_URL", smtp.as_str()),
            // The claim lapses 3 s after the victim's: its SMTP command waits up to 1.5 s.
            ("CHECKOUT_MAIL_LEASE_MS", "3000"),
        ];
        let mut victim = Process::start(&env);
        let reply = checkout_at(&victim, "H-1", "h-1").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let id = message_id(&reply);
        until("the server has the message", async || server.outcomes() == ["held"]).await;
        victim.signal("KILL");
        victim.wait(Duration::from_secs(10));
        assert_eq!(sent(&db, "h-1").await, 0, "killed before the row was marked");
        let _survivor = Process::start(&env);
        until("the row is sent", async || sent(&db, "h-1").await == 1).await;
        // SMTP cannot close this case: the message is delivered twice, as one message.
        assert_eq!(server.outcomes(), ["held", "accepted"]);
        let ids: HashSet<String> = server
            .received()
            .iter()
            .map(|m| m["message_id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(ids, HashSet::from([id]));
        assert_eq!(rows(&db, "h-1").await, 1);
    }
);

both_backends!(
    the_sweep_gives_up_after_its_attempts_and_the_clients_retry_still_resumes,
    |backend| async move {
        // Every model request fails: the operation never finishes by itself.
        let h = Harness::with(backend, "503", |s| {
            s.idempotency.recovery_max_attempts = 2;
        })
        .await;
        let reply = checkout(&h, "G-1", "g-1").await;
        assert_eq!(reply.status, 502, "{}", reply.text());
        until("the sweep gave up", async || {
            h.db.count(
                "SELECT count(*) FROM idempotency_keys WHERE key = $1 \
                 AND attention_at IS NOT NULL AND recoveries = 2 AND status IS NULL",
                Some("g-1"),
            )
            .await
                == 1
        })
        .await;
        assert_eq!(h.db.receipts("G-1").await, 0);
        h.model.set_faults(Vec::<FaultRule>::new());
        let retry = checkout(&h, "G-1", "g-1").await;
        assert_eq!(retry.status, 200, "{}", retry.text());
        assert_eq!(h.db.receipts("G-1").await, 1);
        assert_eq!(rows(&h.db, "g-1").await, 1);
    }
);

/// The rows a checkout leaves in the service's own tables: (idempotency records, journal
/// entries, outbox rows).
async fn own_rows(db: &TestDb) -> (i64, i64, i64) {
    (
        db.count("SELECT count(*) FROM idempotency_keys", None)
            .await,
        db.count("SELECT count(*) FROM agent_journal", None).await,
        db.count("SELECT count(*) FROM outbox", None).await,
    )
}

// Under steady load every table but the receipts stops growing: once the retention (the
// idempotency records' TTL) has passed, the sweeper deletes an operation's record, its
// journal entries and its outbox row whose delivery ended. Receipts are the record of
// charges and stay. Two rounds of three keyed checkouts with an email: after each, the
// same rows, then none.
both_backends!(
    the_tables_stop_growing_once_their_retention_passes,
    |backend| async move {
        let h = Harness::with(backend, "", |s| {
            s.idempotency.ttl = Duration::from_secs(5);
            // Within the TTL, as the settings require: 2 loop attempts of 1.8 s + 0.1 s.
            s.server.timeout = Duration::from_millis(4_000);
            s.assistant.retry.timeout = Duration::from_millis(1_800);
            s.assistant.retry.max_retries = 1;
            s.assistant.retry.backoff_max = Duration::from_millis(100);
            s.model_request.timeout = Duration::from_millis(1_500);
        })
        .await;
        let mut first_round = None;
        for round in ["A", "B"] {
            for i in 1..=3 {
                let (order, key) = (format!("{round}-{i}"), format!("{round}-key-{i}"));
                let reply = checkout(&h, &order, &key).await;
                assert_eq!(reply.status, 200, "{}", reply.text());
            }
            until("the round's three messages are sent", async || {
                h.db.count("SELECT count(*) FROM outbox WHERE status = 'sent'", None)
                    .await
                    == 3
            })
            .await;
            let rows = own_rows(&h.db).await;
            assert_eq!(
                (rows.0, rows.2),
                (3, 3),
                "records and outbox rows: {rows:?}"
            );
            assert!(
                rows.1 >= 3 * 3,
                "three journal entries a checkout at least: {rows:?}"
            );
            // The second round leaves exactly what the first left: nothing accumulates.
            assert_eq!(*first_round.get_or_insert(rows), rows);
            crate::common::until_within(
                "the retention passed and the sweeper emptied the tables",
                Duration::from_secs(20),
                async || own_rows(&h.db).await == (0, 0, 0),
            )
            .await;
        }
        assert_eq!(h.db.all_receipts().await, 6);
    }
);
