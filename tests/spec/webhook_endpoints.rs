//! `checkout webhooks add|list|remove` (docs/webhooks.md): more endpoints, each with its
//! URL, its events and its secret, stored in the database by the real command; each
//! receives exactly the events of its types, signed with its own secret (verified by the
//! reference library); a removed one receives nothing more; a bad URL, event type or
//! secret is refused with exit 2 and stores nothing.

use std::time::Duration;

use checkout::caller::AuthMode;
use checkout::webhooks::WebhookSettings;

use crate::auth::Service;
use crate::common::receiver::{Receiver, verify};
use crate::common::{Backend, TestDb, client, post, until};

const SECRET: &str = "whsec_AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";

/// `checkout webhooks ARGS…` on `db`: exit status, stdout, stderr.
fn webhooks(db: &TestDb, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_checkout"))
        .arg("webhooks")
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env_remove("CHECKOUT_CONFIG")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run checkout webhooks");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn stored(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM webhook_subscriptions", None)
        .await
}

// Seen failing: with the fan-out ignoring an endpoint's events (every enabled endpoint
// taking every event), the charge endpoint received the refund too: 2 requests where 1
// (both stores); with the `delivered` count taken out of `Deliverer::verdict`, /metrics
// lacked `checkout_webhook_deliveries_total{outcome="delivered"} 2` (both stores).
both_backends!(
    two_endpoints_added_by_the_command_each_receive_their_own_events_until_removed,
    |backend| async move {
        let db = TestDb::new(backend).await;
        let charges = Receiver::start(vec![]).await;
        let refunds = Receiver::start(vec![]).await;
        let (code, out, err) = webhooks(
            &db,
            &[
                "add",
                &charges.url,
                "--events",
                "charge.succeeded",
                "--secret",
                SECRET,
            ],
        );
        assert_eq!(code, 0, "{err}");
        let charges_id = out.trim().to_owned();
        assert!(charges_id.starts_with("ep_"), "{out}");
        // No --secret: one is made and printed once, after the id.
        let (code, out, err) =
            webhooks(&db, &["add", &refunds.url, "--events", "refund.succeeded"]);
        assert_eq!(code, 0, "{err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        let (refunds_id, made) = (lines[0].to_owned(), lines[1].to_owned());
        assert!(made.starts_with("whsec_"), "{out}");

        // Bad input: exit 2, a message saying what is wrong, nothing stored.
        for (args, says) in [
            (vec!["add", "not a url"], "is not a URL"),
            (
                vec!["add", "ftp://example.com/hooks"],
                "is not an http:// or https:// URL",
            ),
            (
                vec!["add", "http://example.com/h", "--events", "charge.failed"],
                "\"charge.failed\" is not an event type",
            ),
            (
                vec![
                    "add",
                    "http://example.com/h",
                    "--secret",
                    "whsec_AAECAwQFBgcICQoLDA0ODw==",
                ],
                "--secret must be whsec_ + base64 of 24 to 64 bytes, not 16 bytes",
            ),
            (
                vec!["add", "http://example.com/h", "--secret", "hunter2"],
                "--secret must start with whsec_",
            ),
            (
                vec!["remove", "ep_nothing"],
                "no webhook endpoint ep_nothing",
            ),
            // CHECKOUT_WEBHOOK_URL's: the setting's, not the command's.
            (
                vec!["remove", "env"],
                "webhook endpoint env is CHECKOUT_WEBHOOK_URL's",
            ),
        ] {
            let (code, _, err) = webhooks(&db, &args);
            assert_eq!(code, 2, "{args:?}: {err}");
            assert!(err.contains(says), "{args:?}: {err}");
        }
        assert_eq!(stored(&db).await, 2);

        // list: both, their events, never a secret whole.
        let (code, listed, _) = webhooks(&db, &["list"]);
        assert_eq!(code, 0);
        assert_eq!(
            listed.lines().count(),
            3,
            "a header and two endpoints: {listed}"
        );
        assert!(
            listed.contains(&charges_id) && listed.contains(&refunds_id),
            "{listed}"
        );
        assert!(listed.contains("charge.succeeded") && listed.contains("refund.succeeded"));
        assert!(
            !listed.contains(SECRET) && !listed.contains(&made),
            "{listed}"
        );

        let s = Service::on(db, AuthMode::Off, |s| {
            s.webhooks.retry_schedule = WebhookSettings::parse_schedule("100ms").unwrap();
        })
        .await;
        assert_eq!(s.checkout_of("E-1", "10.00", &[]).await.status, 200);
        let url = format!("{}/refunds?orderId=E-1&amount=1.00", s.url_base());
        let refund = post(&client(), &url, &[("idempotency-key", "e-rf")], None).await;
        assert_eq!(refund.status, 200, "{}", refund.text());
        until("each endpoint gets its event", async || {
            charges.delivered().len() == 1 && refunds.delivered().len() == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (to_charges, to_refunds) = (charges.got(), refunds.got());
        assert_eq!(to_charges.len(), 1);
        assert_eq!(to_refunds.len(), 1);
        assert_eq!(
            verify(SECRET, &to_charges),
            [Ok("charge.succeeded".to_owned())]
        );
        assert_eq!(
            verify(&made, &to_refunds),
            [Ok("refund.succeeded".to_owned())]
        );
        // Each with its own secret: the other's does not verify it.
        assert!(verify(&made, &to_charges)[0].is_err());
        assert!(verify(SECRET, &to_refunds)[0].is_err());
        assert_eq!(
            s.db.count(
                "SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'",
                None
            )
            .await,
            2
        );
        // The metrics count the added endpoints' deliveries too.
        let metrics = s.get("/metrics", &[]).await.text();
        assert!(
            metrics.contains("checkout_webhook_deliveries_total{outcome=\"delivered\"} 2"),
            "{metrics}"
        );

        // Removed: nothing more is sent to it. The command cannot open a SQLite file the
        // service holds; there the service's database is changed as the command does.
        match backend {
            Backend::Postgres => {
                let (code, _, err) = webhooks(&s.db, &["remove", &charges_id]);
                assert_eq!(code, 0, "{err}");
            }
            Backend::Sqlite => assert!(
                checkout::webhooks::endpoints::remove(s.state.db(), &charges_id)
                    .await
                    .unwrap()
            ),
        }
        // The deliverer reads the endpoints every second.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(s.checkout_of("E-2", "10.00", &[]).await.status, 200);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(charges.got().len(), 1, "nothing more after remove");
        assert_eq!(refunds.got().len(), 1, "not its type");
        assert_eq!(stored(&s.db).await, 1);
    }
);

// 410 Gone disables the endpoint that said it, and only that one.
// Seen failing: with `Fanout::disable` not recording the endpoint disabled (its statement
// matching no row), the gone endpoint was sent its event again: on Postgres 3 requests
// where 1, on SQLite the wait for "both are tried" (one request to it) timed out.
both_backends!(
    a_410_disables_only_the_endpoint_that_answered_it,
    |backend| async move {
        use crate::common::receiver::Answer;
        let db = TestDb::new(backend).await;
        let gone = Receiver::start(vec![Answer::Status(410)]).await;
        let kept = Receiver::start(vec![]).await;
        for url in [&gone.url, &kept.url] {
            let (code, _, err) = webhooks(
                &db,
                &[
                    "add",
                    url,
                    "--events",
                    "charge.succeeded",
                    "--secret",
                    SECRET,
                ],
            );
            assert_eq!(code, 0, "{err}");
        }
        let s = Service::on(db, AuthMode::Off, |s| {
            s.webhooks.retry_schedule = WebhookSettings::parse_schedule("100ms").unwrap();
        })
        .await;
        assert_eq!(s.checkout_of("G-1", "10.00", &[]).await.status, 200);
        until("both are tried", async || {
            gone.got().len() == 1 && kept.delivered().len() == 1
        })
        .await;
        assert_eq!(s.checkout_of("G-2", "10.00", &[]).await.status, 200);
        until("the kept one gets the second", async || {
            kept.delivered().len() == 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(gone.got().len(), 1, "nothing after its 410");
        assert_eq!(kept.got().len(), 2);
        assert!(verify(SECRET, &kept.got()).iter().all(Result::is_ok));
        let disabled =
            s.db.count(
                "SELECT count(*) FROM webhook_subscriptions WHERE disabled_at IS NOT NULL",
                None,
            )
            .await;
        assert_eq!(disabled, 1);
        let (_, listed, _) = webhooks_listed_or_skip(&s.db, backend);
        if let Some(listed) = listed {
            assert_eq!(listed.matches(" disabled ").count(), 1, "{listed}");
        }
    }
);

/// `webhooks list` on Postgres (the command cannot open a SQLite file the service holds).
fn webhooks_listed_or_skip(db: &TestDb, backend: Backend) -> (i32, Option<String>, String) {
    match backend {
        Backend::Postgres => {
            let (code, out, err) = webhooks(db, &["list"]);
            (code, Some(out), err)
        }
        Backend::Sqlite => (0, None, String::new()),
    }
}

// An event goes to every endpoint that takes its type, CHECKOUT_WEBHOOK_URL among them, by
// one path: once each has it, the event is pending no more. Here CHECKOUT_WEBHOOK_URL takes
// only refunds, and the endpoint added by the command takes the charge.
// Seen failing (before one delivery path, when CHECKOUT_WEBHOOK_URL kept its own state in
// webhook_events): "delivered to everyone who takes it", left 1, right 0, on both stores:
// the charge, sent to the added endpoint, stayed pending for CHECKOUT_WEBHOOK_URL, which
// does not take it.
both_backends!(
    an_event_delivered_to_every_endpoint_that_takes_it_is_no_longer_pending,
    |backend| async move {
        let db = TestDb::new(backend).await;
        let configured = Receiver::start(vec![]).await;
        let added = Receiver::start(vec![]).await;
        let (code, _, err) = webhooks(
            &db,
            &[
                "add",
                &added.url,
                "--events",
                "charge.succeeded",
                "--secret",
                SECRET,
            ],
        );
        assert_eq!(code, 0, "{err}");
        let s = Service::on(db, AuthMode::Off, |s| {
            s.webhooks.url = Some(configured.url.clone());
            s.webhooks.secret = Some(checkout::secret::Secret::new(SECRET));
            s.webhooks.events = WebhookSettings::parse_events("refund.succeeded").unwrap();
            s.webhooks.retry_schedule = WebhookSettings::parse_schedule("100ms").unwrap();
        })
        .await;
        assert_eq!(s.checkout_of("P-1", "10.00", &[]).await.status, 200);
        until("the added endpoint gets the charge", async || {
            added.delivered().len() == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(added.got().len(), 1);
        assert_eq!(configured.got().len(), 0, "not its type");
        let events = |status: &'static str| {
            let db = &s.db;
            async move {
                db.count(
                    "SELECT count(*) FROM webhook_events WHERE status = $1",
                    Some(status),
                )
                .await
            }
        };
        assert_eq!(
            events("pending").await,
            0,
            "delivered to everyone who takes it"
        );
        assert_eq!(events("delivered").await, 1);
        let metrics = s.get("/metrics", &[]).await.text();
        assert!(
            metrics.contains("checkout_webhook_events_pending 0"),
            "{metrics}"
        );
    }
);

// A batch's attempts go out at once and their outcomes are recorded as they come: an
// endpoint that does not answer does not hold the record of another's delivery.
// Seen failing (the batch's outcomes recorded once every attempt had ended): timed out
// waiting until the answered delivery is recorded, on both stores: it waited for the
// other's 10 s timeout.
both_backends!(
    an_endpoint_that_does_not_answer_does_not_hold_back_anothers_record,
    |backend| async move {
        use crate::common::receiver::Answer;
        let db = TestDb::new(backend).await;
        let silent = Receiver::start(vec![Answer::Hang]).await;
        let quick = Receiver::start(vec![]).await;
        for url in [&silent.url, &quick.url] {
            let args = [
                "add",
                url,
                "--events",
                "charge.succeeded",
                "--secret",
                SECRET,
            ];
            let (code, _, err) = webhooks(&db, &args);
            assert_eq!(code, 0, "{err}");
        }
        let s = Service::on(db, AuthMode::Off, |s| {
            s.webhooks.retry_schedule = WebhookSettings::parse_schedule("100ms").unwrap();
            s.webhooks.timeout = Duration::from_secs(10);
            s.webhooks.lease = Duration::from_secs(20);
        })
        .await;
        assert_eq!(s.checkout_of("H-1", "10.00", &[]).await.status, 200);
        until("both are tried", async || {
            silent.got().len() == 1 && quick.delivered().len() == 1
        })
        .await;
        crate::common::until_within(
            "the answered delivery is recorded",
            Duration::from_secs(5),
            async || {
                s.db.count(
                    "SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'",
                    None,
                )
                .await
                    == 1
            },
        )
        .await;
        assert_eq!(
            s.db.count(
                "SELECT count(*) FROM webhook_events WHERE status = 'pending'",
                None
            )
            .await,
            1,
            "still pending for the silent one"
        );
    }
);
