//! Webhook delivery (docs/webhooks.md): each event reaches the endpoint as a Standard
//! Webhook that the reference library verifies; a failed attempt is retried with the same
//! `webhook-id` on the schedule (after `Retry-After` on 429/503); 410 disables the
//! endpoint and checkouts go on; an event whose deliverer went away mid-delivery is
//! delivered by another instance once its lease lapses.

use std::time::Duration;

use checkout::config::Settings;
use checkout::payments::PerCurrency;
use checkout::secret::Secret;
use checkout::webhooks::WebhookSettings;

use crate::common::receiver::{Answer, Receiver, verify};
use crate::common::{
    Backend, Harness, Instance, TestDb, client, post, scripted, test_settings, until,
};

/// `whsec_` + base64 of the bytes 1..=32.
const SECRET: &str = "whsec_AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";

/// Events to `receiver`, retried after `schedule`'s waits.
fn hooked(s: &mut Settings, receiver: &Receiver, schedule: &str) {
    s.webhooks.url = Some(receiver.url.clone());
    s.webhooks.secret = Some(Secret::new(SECRET));
    s.webhooks.retry_schedule = WebhookSettings::parse_schedule(schedule).unwrap();
    s.webhooks.timeout = Duration::from_millis(2_000);
    s.webhooks.lease = Duration::from_millis(3_000);
    s.payments.approval_above = PerCurrency::parse("USD:100.00").unwrap();
}

async fn event_rows(db: &TestDb, status: &str) -> i64 {
    db.count(
        "SELECT count(*) FROM webhook_events WHERE status = $1",
        Some(status),
    )
    .await
}

async fn decide(h: &Harness, id: &str, decision: &str) -> u16 {
    let url = h.url(&format!("/approvals/{id}/{decision}"));
    post(&client(), &url, &[], None).await.status
}

async fn pause(h: &Harness, order: &str) -> String {
    let reply = h
        .post(
            &format!("/checkout?orderId={order}&amount=500.00"),
            &[("idempotency-key", order)],
            None,
        )
        .await;
    assert_eq!(reply.status, 202, "{}", reply.text());
    reply.json()["approval"]["id"].as_str().unwrap().to_owned()
}

// Seen failing: with the signature made over "{timestamp}.{id}.{body}" (the order
// swapped in `SigningKey::sign`), standardwebhooks refused all 7:
// "WebhookVerificationError: No matching signature found".
both_backends!(
    every_event_arrives_once_and_verifies_with_the_reference_library,
    |backend| async move {
        let receiver = Receiver::start(vec![]).await;
        let h = Harness::with(backend, "", |s| hooked(s, &receiver, "100ms")).await;
        assert_eq!(h.checkout("W-1", "10.00").await.status, 200);
        let approved = pause(&h, "W-BIG-1").await;
        assert_eq!(decide(&h, &approved, "approve").await, 200);
        let denied = pause(&h, "W-BIG-2").await;
        assert_eq!(decide(&h, &denied, "deny").await, 200);
        let refund = h
            .post(
                "/refunds?orderId=W-1&amount=1.00",
                &[("idempotency-key", "w-rf")],
                None,
            )
            .await;
        assert_eq!(refund.status, 200, "{}", refund.text());

        // charge x2, requested x2, approved, denied, refund.
        until("7 events are delivered", async || {
            receiver.delivered().len() >= 7
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let got = receiver.got();
        assert_eq!(got.len(), 7, "one request per event, none repeated");
        let mut ids: Vec<_> = got.iter().map(|g| g.id().to_owned()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 7, "a webhook-id per event");
        let mut types: Vec<String> = verify(SECRET, &got)
            .into_iter()
            .map(|v| v.expect("the reference library verifies it"))
            .collect();
        types.sort();
        assert_eq!(
            types,
            [
                "approval.approved",
                "approval.denied",
                "approval.requested",
                "approval.requested",
                "charge.succeeded",
                "charge.succeeded",
                "refund.succeeded"
            ]
        );
        let requested: Vec<_> = got
            .iter()
            .map(|g| g.json())
            .filter(|e| e["type"] == "approval.requested")
            .map(|e| e["data"]["orderId"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            requested.len(),
            2,
            "one approval.requested per paused checkout"
        );
        for g in &got {
            assert_eq!(g.headers["content-type"], "application/json");
            assert!(g.headers["webhook-signature"].starts_with("v1,"));
        }
        // Another secret does not verify them: the check is real.
        let other = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        assert!(verify(other, &got).iter().all(Result::is_err));
        assert_eq!(event_rows(&h.db, "delivered").await, 7);
        let metrics = h.get("/metrics").await.text();
        assert!(
            metrics.contains("checkout_webhook_deliveries_total{outcome=\"delivered\"} 7"),
            "{metrics}"
        );
    }
);

// Seen failing: with the attempt sent under a fresh id (`format!("msg_{}", Uuid::now_v7()…)`
// in place of `row.id` in `Deliverer::send`), the retries came with other webhook-ids.
both_backends!(
    a_500_is_retried_on_the_schedule_with_the_same_webhook_id_and_delivered_once,
    |backend| async move {
        let receiver = Receiver::start(vec![Answer::Status(500), Answer::Status(503)]).await;
        let h = Harness::with(backend, "", |s| hooked(s, &receiver, "300ms,300ms")).await;
        assert_eq!(h.checkout("W-2", "10.00").await.status, 200);
        until("the event is delivered", async || {
            receiver.delivered().len() == 1
        })
        .await;
        let got = receiver.got();
        assert_eq!(got.len(), 3, "500, 503 (no Retry-After), then 204");
        assert!(got.iter().all(|g| g.id() == got[0].id()), "one webhook-id");
        assert!(got.iter().all(|g| g.body == got[0].body), "one body");
        assert!(got[1].at - got[0].at >= Duration::from_millis(300));
        assert!(verify(SECRET, &got).iter().all(Result::is_ok));
        assert_eq!(event_rows(&h.db, "delivered").await, 1);
        let metrics = h.get("/metrics").await.text();
        assert!(metrics.contains("checkout_webhook_deliveries_total{outcome=\"retried\"} 2"));
    }
);

// Seen failing: with Retry-After capped at the schedule's longest wait (the first version
// of `Deliverer::deliver`), the second attempt came 100 ms after the first, not 1 s; with
// the attempt sent under a fresh id, the ids differed.
both_backends!(
    a_429_waits_for_its_retry_after_and_a_redirect_is_not_followed,
    |backend| async move {
        let receiver = Receiver::start(vec![
            Answer::With(429, "retry-after", "1"),
            Answer::With(302, "location", "/elsewhere"),
        ])
        .await;
        let h = Harness::with(backend, "", |s| hooked(s, &receiver, "100ms,100ms")).await;
        assert_eq!(h.checkout("W-3", "10.00").await.status, 200);
        until("the event is delivered", async || {
            receiver.delivered().len() == 1
        })
        .await;
        let got = receiver.got();
        assert_eq!(got.len(), 3, "429, 302, 204");
        assert!(
            got[1].at - got[0].at >= Duration::from_secs(1),
            "Retry-After: 1 is honoured"
        );
        assert!(
            got.iter().all(|g| g.path == "/hooks"),
            "the redirect is not followed"
        );
        assert!(got.iter().all(|g| g.id() == got[0].id()));
    }
);

// Seen failing: with 410 read as any other failure (`410 => Attempt::Gone` taken out),
// the event was sent again on the schedule: 4 requests where 1.
both_backends!(
    a_410_disables_the_endpoint_and_checkouts_go_on,
    |backend| async move {
        let receiver = Receiver::start(vec![Answer::Status(410)]).await;
        let h = Harness::with(backend, "", |s| hooked(s, &receiver, "100ms,100ms,100ms")).await;
        assert_eq!(h.checkout("W-4", "10.00").await.status, 200);
        until("the endpoint answers 410", async || {
            receiver.got().len() == 1
        })
        .await;
        assert_eq!(h.checkout("W-5", "10.00").await.status, 200);
        assert_eq!(h.checkout("W-6", "10.00").await.status, 200);
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        assert_eq!(receiver.got().len(), 1, "nothing is sent after the 410");
        assert_eq!(
            h.db.count(
                "SELECT count(*) FROM webhook_subscriptions WHERE disabled_at IS NOT NULL",
                None
            )
            .await,
            1,
            "disabled for every instance"
        );
        assert_eq!(event_rows(&h.db, "pending").await, 3, "kept, not sent");
        let metrics = h.get("/metrics").await.text();
        assert!(metrics.contains("checkout_webhook_deliveries_total{outcome=\"gone\"} 1"));
        until("the backlog's gauge counts the 3 kept", async || {
            h.get("/metrics")
                .await
                .text()
                .contains("checkout_webhook_events_pending 3")
        })
        .await;
    }
);

// CHECKOUT_WEBHOOK_URL's events are kept for it while it is gone (410), and go out to the
// URL configured in its place: the same endpoint, another URL.
// Seen failing: with `endpoints::configure` keeping `disabled_at` whatever the URL, the
// new URL got nothing: timed out waiting until both kept events reach it.
both_backends!(
    a_gone_urls_events_go_to_the_url_configured_in_its_place,
    |backend| async move {
        let gone = Receiver::start(vec![Answer::Status(410)]).await;
        let db = TestDb::new(backend).await;
        let model = scripted("").await;
        let mut settings = test_settings(&db, &model);
        hooked(&mut settings, &gone, "100ms");
        let first = Instance::start(settings.clone()).await;
        let checkout = async |order: &str| {
            let url = format!("{}/checkout?orderId={order}&amount=10.00", first.base);
            assert_eq!(post(&client(), &url, &[], None).await.status, 200);
        };
        checkout("W-G1").await;
        until("the endpoint answers 410", async || gone.got().len() == 1).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        checkout("W-G2").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(event_rows(&db, "pending").await, 2, "kept, not sent");
        drop(first);
        tokio::time::sleep(Duration::from_millis(200)).await;

        // Restarted with the same URL: still gone, nothing sent.
        let again = Instance::start(settings.clone()).await;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(
            gone.got().len(),
            1,
            "a URL that answered 410 stays disabled"
        );
        drop(again);
        tokio::time::sleep(Duration::from_millis(200)).await;

        // Another URL: both kept events reach it, once each.
        let next = Receiver::start(vec![]).await;
        hooked(&mut settings, &next, "100ms");
        let _moved = Instance::start(settings).await;
        until("both kept events reach the new URL", async || {
            next.delivered().len() == 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(next.got().len(), 2);
        assert_eq!(gone.got().len(), 1);
        assert!(verify(SECRET, &next.got()).iter().all(Result::is_ok));
        assert_eq!(event_rows(&db, "delivered").await, 2);
    }
);

// Seen failing: with the lease's lapse taken out of the claim (`AND (claimed_until IS
// NULL)` only), the second instance never took the event: timed out waiting.
both_backends!(
    an_event_whose_deliverer_went_away_mid_delivery_is_delivered_by_another_instance_once,
    |backend| async move {
        let receiver = Receiver::start(vec![Answer::Hang]).await;
        let db = TestDb::new(backend).await;
        let model = scripted("").await;
        let mut settings = test_settings(&db, &model);
        hooked(&mut settings, &receiver, "100ms");
        // The first attempt hangs longer than the lease: the instance goes away first.
        settings.webhooks.timeout = Duration::from_secs(20);
        settings.webhooks.lease = Duration::from_millis(1_500);
        let first = Instance::start(settings.clone()).await;
        let reply = post(
            &client(),
            &format!("{}/checkout?orderId=W-7&amount=10.00", first.base),
            &[],
            None,
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        until("the first instance sends the event", async || {
            receiver.got().len() == 1
        })
        .await;
        drop(first);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _second = Instance::start(settings).await;
        until("another instance delivers it", async || {
            receiver.delivered().len() == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let got = receiver.got();
        assert_eq!(got.len(), 2, "the hung attempt and the delivery");
        assert_eq!(got[0].id(), got[1].id());
        assert_eq!(receiver.delivered().len(), 1);
        assert_eq!(event_rows(&db, "delivered").await, 1);
        assert!(verify(SECRET, &got).iter().all(Result::is_ok));
    }
);

// Postgres only: SQLite serves one instance per file.
// Seen failing: with the claim's lease taken out (`claimed_until` left as it was, so a row
// being sent stays claimable), the two instances sent 23 requests for the 20 events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_deliver_each_event_exactly_once() {
    let receiver = Receiver::start(vec![]).await;
    let db = TestDb::new(Backend::Postgres).await;
    let model = scripted("").await;
    let mut settings = test_settings(&db, &model);
    hooked(&mut settings, &receiver, "100ms");
    let instances = [
        Instance::start(settings.clone()).await,
        Instance::start(settings).await,
    ];
    for i in 0..20 {
        let base = &instances[i % 2].base;
        let reply = post(
            &client(),
            &format!("{base}/checkout?orderId=W-P-{i}&amount=10.00"),
            &[],
            None,
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    until("20 events are delivered", async || {
        receiver.delivered().len() >= 20
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = receiver.got();
    let mut ids: Vec<_> = got.iter().map(|g| g.id().to_owned()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20);
    assert_eq!(got.len(), 20, "each event sent once");
    assert_eq!(event_rows(&db, "delivered").await, 20);
}

// During a rotation CHECKOUT_WEBHOOK_SECRET lists the old and the new secret: each request
// is signed with both, so a consumer holding either one alone verifies it.
// Seen failing: with `SigningKeys::sign` signing with the first key only,
// `webhook-signature` carried 1 signature where 2 (both stores).
both_backends!(
    during_a_rotation_a_consumer_with_the_old_or_the_new_secret_alone_verifies,
    |backend| async move {
        const NEW: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let receiver = Receiver::start(vec![]).await;
        let h = Harness::with(backend, "", |s| {
            hooked(s, &receiver, "100ms");
            s.webhooks.secret = Some(Secret::new(format!("{SECRET} {NEW}")));
        })
        .await;
        assert_eq!(h.checkout("W-ROT", "10.00").await.status, 200);
        until("the event is delivered", async || {
            receiver.delivered().len() == 1
        })
        .await;
        let got = receiver.got();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].headers["webhook-signature"].split(' ').count(),
            2,
            "one signature per secret"
        );
        for secret in [SECRET, NEW] {
            assert_eq!(
                verify(secret, &got),
                [Ok("charge.succeeded".to_owned())],
                "verified with {secret} alone"
            );
        }
        let other = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        assert!(verify(other, &got)[0].is_err());
    }
);
