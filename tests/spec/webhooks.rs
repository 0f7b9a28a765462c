//! Webhooks (docs/webhooks.md): every fact the operator's endpoint takes is announced by
//! one event, written in the transaction of the fact (an approval asked for or decided, a
//! receipt, a refund), whatever repeats around it; with no endpoint, none is written.

use std::time::Duration;

use checkout::config::Settings;
use checkout::payments::PerCurrency;
use serde_json::Value;

use crate::common::{Backend, Harness, Reply, TestDb, client, post, until};

/// Where the events would go: nothing listens there (delivery is not what these test).
const NOWHERE: &str = "http://127.0.0.1:9/hooks";

fn with_endpoint(s: &mut Settings) {
    s.webhooks.url = Some(NOWHERE.into());
    // A URL needs its secret (refused at start-up without one).
    s.webhooks.secret = Some(checkout::secret::Secret::new(
        "whsec_AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=",
    ));
    s.payments.approval_above = PerCurrency::parse("USD:100.00").unwrap();
}

/// The bodies of the events of type `kind`, oldest first.
async fn events(db: &TestDb, kind: &str) -> Vec<Value> {
    const SQL: &str = "SELECT body FROM webhook_events WHERE type = $1 ORDER BY created_at, id";
    let bodies: Vec<String> = match db.backend {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
            let rows = sqlx::query_scalar(SQL)
                .bind(kind)
                .fetch_all(&pool)
                .await
                .expect("events");
            pool.close().await;
            rows
        }
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.expect("connect");
            let rows = sqlx::query_scalar(SQL)
                .bind(kind)
                .fetch_all(&pool)
                .await
                .expect("events");
            pool.close().await;
            rows
        }
    };
    bodies
        .iter()
        .map(|b| serde_json::from_str(b).expect("a JSON body"))
        .collect()
}

async fn all_events(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM webhook_events", None).await
}

async fn paused(h: &Harness, order: &str, key: &str) -> String {
    let reply = h
        .post(
            &format!("/checkout?orderId={order}&amount=500.00"),
            &[("idempotency-key", key)],
            None,
        )
        .await;
    assert_eq!(reply.status, 202, "{}", reply.text());
    reply.json()["approval"]["id"].as_str().unwrap().to_owned()
}

async fn decide(h: &Harness, id: &str, decision: &str, body: Option<&str>) -> Reply {
    let url = h.url(&format!("/approvals/{id}/{decision}"));
    post(&client(), &url, &[], body).await
}

// Seen failing, in one run with these taken out: the event's insert in `Approvals::pause`
// (SQLite: 0 approval.requested where 1) and the `WHERE` of
// `webhooks::pg_events_of_charged!()` (Postgres: the repeated charge of S-1, which
// charged nothing, wrote a second charge.succeeded: 2 where 1).
both_backends!(
    every_fact_writes_exactly_one_event_whatever_repeats,
    |backend| async move {
        let h = Harness::with(backend, "", with_endpoint).await;

        let charged = h.checkout("S-1", "10.00").await;
        assert_eq!(charged.status, 200, "{}", charged.text());
        let again = h.checkout("S-1", "10.00").await;
        assert_eq!(again.json()["charged"], false, "{}", again.text());
        let charges = events(&h.db, "charge.succeeded").await;
        assert_eq!(charges.len(), 1, "one charge, one event: {charges:?}");
        let receipt = &charged.json()["receipt"];
        assert_eq!(charges[0]["type"], "charge.succeeded");
        assert_eq!(charges[0]["data"]["receiptId"], receipt["id"]);
        assert_eq!(charges[0]["data"]["orderId"], "S-1");
        assert_eq!(charges[0]["data"]["amount"], "10.00");
        assert_eq!(charges[0]["data"]["currency"], "USD");
        assert!(charges[0]["timestamp"].as_str().unwrap().ends_with('Z'));

        // Paused, asked again, approved, approved again: one request, one approval.
        let approved = paused(&h, "BIG-1", "big-1").await;
        let repeat = h
            .post(
                "/checkout?orderId=BIG-1&amount=500.00",
                &[("idempotency-key", "big-1")],
                None,
            )
            .await;
        assert_eq!(repeat.status, 202);
        let requested = events(&h.db, "approval.requested").await;
        assert_eq!(requested.len(), 1, "{requested:?}");
        assert_eq!(requested[0]["data"]["id"], approved.as_str());
        assert_eq!(requested[0]["data"]["status"], "pending");
        assert_eq!(requested[0]["data"]["amount"], "500.00");
        assert_eq!(requested[0]["data"]["orderId"], "BIG-1");
        assert_eq!(decide(&h, &approved, "approve", None).await.status, 200);
        assert_eq!(decide(&h, &approved, "approve", None).await.status, 200);
        let decided = events(&h.db, "approval.approved").await;
        assert_eq!(decided.len(), 1, "{decided:?}");
        assert_eq!(decided[0]["data"]["id"], approved.as_str());
        assert_eq!(decided[0]["data"]["status"], "approved");
        let charges = events(&h.db, "charge.succeeded").await;
        assert_eq!(charges.len(), 2, "the approved charge's: {charges:?}");
        assert_eq!(charges[1]["data"]["orderId"], "BIG-1");

        // Paused, denied, denied again: one denial.
        let denied = paused(&h, "BIG-2", "big-2").await;
        let reason = r#"{"reason":"not this one"}"#;
        assert_eq!(decide(&h, &denied, "deny", Some(reason)).await.status, 200);
        assert_eq!(decide(&h, &denied, "deny", Some(reason)).await.status, 200);
        let denials = events(&h.db, "approval.denied").await;
        assert_eq!(denials.len(), 1, "{denials:?}");
        assert_eq!(denials[0]["data"]["id"], denied.as_str());
        assert_eq!(denials[0]["data"]["reason"], "not this one");

        // A refund, and its repeat under the same key: one event.
        let refund = h
            .post(
                "/refunds?orderId=S-1&amount=4.00",
                &[("idempotency-key", "rf-1")],
                None,
            )
            .await;
        assert_eq!(refund.status, 200, "{}", refund.text());
        let repeat = h
            .post(
                "/refunds?orderId=S-1&amount=4.00",
                &[("idempotency-key", "rf-1")],
                None,
            )
            .await;
        assert_eq!(repeat.status, 200);
        let refunds = events(&h.db, "refund.succeeded").await;
        assert_eq!(refunds.len(), 1, "{refunds:?}");
        assert_eq!(refunds[0]["data"]["orderId"], "S-1");
        assert_eq!(refunds[0]["data"]["amount"], "4.00");
        assert_eq!(refunds[0]["data"]["id"], refund.json()["refund"]["id"]);

        assert_eq!(all_events(&h.db).await, 2 + 2 + 1 + 1 + 1);
    }
);

// Seen failing: with the event's insert taken out of `Approvals::settle`, the sweep
// expired the approval and no approval.expired came (timed out waiting, both stores).
both_backends!(
    an_approval_the_sweep_expires_writes_one_expired_event,
    |backend| async move {
        let h = Harness::with(backend, "", |s| {
            with_endpoint(s);
            s.payments.approval_ttl = Duration::from_secs(1);
        })
        .await;
        let id = paused(&h, "BIG-3", "big-3").await;
        until("the sweep expires the approval", async || {
            h.get(&format!("/approvals/{id}")).await.json()["status"] == "expired"
                && !events(&h.db, "approval.expired").await.is_empty()
        })
        .await;
        // A late decision finds it expired and writes nothing more.
        assert_eq!(decide(&h, &id, "approve", None).await.status, 410);
        let expired = events(&h.db, "approval.expired").await;
        assert_eq!(expired.len(), 1, "{expired:?}");
        assert_eq!(expired[0]["data"]["id"], id.as_str());
        assert_eq!(expired[0]["data"]["status"], "expired");
        assert_eq!(all_events(&h.db).await, 2, "requested, expired");
    }
);

// Seen failing: with `WebhookSettings::wanted` answering the events whatever the URL (in
// the run that also took the approvals' inserts out), 1 row, the charge's, where 0.
both_backends!(
    without_an_endpoint_no_event_is_written,
    |backend| async move {
        let h = Harness::with(backend, "", |s| {
            with_endpoint(s);
            s.webhooks.url = None;
        })
        .await;
        assert_eq!(h.checkout("S-2", "10.00").await.status, 200);
        let id = paused(&h, "BIG-4", "big-4").await;
        assert_eq!(decide(&h, &id, "deny", None).await.status, 200);
        assert_eq!(all_events(&h.db).await, 0);
    }
);

// Postgres commits a charge and its event in one statement of the group writer, on a
// connection with sequential scans off (`db::PG_WRITER_SETTINGS`); the event's part
// (`webhooks::DELIVERIES`) can only scan `webhook_subscriptions`, a scan costed as
// disabled, far above `jit_above_cost`, and with JIT on, Postgres compiled the statement
// at every execution, which every checkout's commit waited for. Asserted: on the
// writer's settings, the plan of an event's deliveries compiles nothing.
// Seen failing with `jit` left out of the writer's settings: the plan ended "JIT:
// Functions: 4".
#[tokio::test]
async fn on_postgres_the_writers_plan_for_an_events_deliveries_compiles_nothing() {
    use sqlx::Connection;
    let h = Harness::with(Backend::Postgres, "", with_endpoint).await;
    let mut c = sqlx::PgConnection::connect(&h.db.url).await.unwrap();
    sqlx::query(checkout::db::PG_WRITER_SETTINGS)
        .execute(&mut c)
        .await
        .unwrap();
    let explain = format!("EXPLAIN {}", checkout::webhooks::DELIVERIES);
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .bind("msg_plan")
        .bind("charge.succeeded")
        .fetch_all(&mut c)
        .await
        .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("Seq Scan on webhook_subscriptions"), "{plan}");
    assert!(!plan.contains("JIT"), "{plan}");
}
