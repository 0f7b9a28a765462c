//! `budget.threshold` (docs/webhooks.md): a caller's day crossing 80 % and then 100 % of its
//! budget is announced once per caller, currency, day and threshold, in the transaction of
//! the charge that crossed it, however many checkouts race; each event arrives as a
//! Standard Webhook the reference library verifies.

use std::sync::Arc;
use std::time::Duration;

use checkout::caller::AuthMode;
use checkout::config::Settings;
use checkout::payments::PerCurrency;
use checkout::secret::Secret;
use checkout::webhooks::WebhookSettings;
use serde_json::Value;

use crate::auth::{Service, bearer};
use crate::common::receiver::{Receiver, verify};
use crate::common::{Backend, until};

/// `whsec_` + base64 of the bytes 1..=32.
const SECRET: &str = "whsec_AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";

fn hooked(s: &mut Settings, receiver: &Receiver) {
    s.webhooks.url = Some(receiver.url.clone());
    s.webhooks.secret = Some(Secret::new(SECRET));
    s.webhooks.retry_schedule = WebhookSettings::parse_schedule("100ms").unwrap();
    s.webhooks.events = WebhookSettings::parse_events("budget.threshold").unwrap();
    s.payments.budget_per_day = PerCurrency::parse("USD:100.00").unwrap();
}

/// The `data` of the `budget.threshold` events received, each verified by the reference
/// library.
fn crossings(receiver: &Receiver) -> Vec<Value> {
    let got = receiver.delivered();
    for verdict in verify(SECRET, &got) {
        assert_eq!(
            verdict.expect("standardwebhooks verifies it"),
            "budget.threshold"
        );
    }
    got.iter().map(|g| g.json()["data"].clone()).collect()
}

/// (caller, threshold, spent) of each crossing, sorted.
fn sorted(data: &[Value]) -> Vec<(String, u64, String)> {
    let mut shorts: Vec<_> = data.iter().map(short).collect();
    shorts.sort();
    shorts
}

fn short(d: &Value) -> (String, u64, String) {
    (
        d["caller"].as_str().unwrap().to_owned(),
        d["threshold"].as_u64().unwrap(),
        d["spent"].as_str().unwrap().to_owned(),
    )
}

// Seen failing: with `Crossing::thresholds` answering every threshold the day has reached
// (`!reached(before, t)` taken out) and the event written whatever the `budget_thresholds`
// insert answered (`recorded <= 1`), 8 events where 4 on both stores (80 again at 95.00
// and 100.00). With the first alone broken the test passed: the primary key alone keeps
// one event per caller, day and threshold.
both_backends!(
    a_days_crossings_of_80_and_100_percent_are_announced_once_per_caller_and_day,
    |backend| async move {
        let receiver = Receiver::start(vec![]).await;
        let s = Arc::new(
            Service::start_with(backend, AuthMode::Required, |s| hooked(s, &receiver)).await,
        );
        let alice = bearer(&s.create_key("alice").await);
        let bob = bearer(&s.create_key("bob").await);
        let as_alice = [("authorization", alice.as_str())];

        // 50 %, 85 % (80 crossed), 95 % (nothing new), 100 % (100 crossed).
        for (order, amount) in [
            ("A-1", "50.00"),
            ("A-2", "35.00"),
            ("A-3", "10.00"),
            ("A-4", "5.00"),
        ] {
            let reply = s.checkout_of(order, amount, &as_alice).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
        }
        // Over the budget: refused, nothing announced.
        assert_eq!(s.checkout_of("A-5", "0.01", &as_alice).await.status, 403);

        // Bob's ten checkouts of 10.00 race: one 80 and one 100, whichever made them.
        let racing: Vec<_> = (0..10)
            .map(|i| {
                let s = s.clone();
                let bob = bob.clone();
                tokio::spawn(async move {
                    s.checkout_of(
                        &format!("B-{i}"),
                        "10.00",
                        &[("authorization", bob.as_str())],
                    )
                    .await
                    .status
                })
            })
            .collect();
        for task in racing {
            assert_eq!(task.await.unwrap(), 200);
        }

        until("4 events are delivered", async || {
            receiver.delivered().len() >= 4
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let today = crossings(&receiver);
        assert_eq!(today.len(), 4, "{today:?}");
        assert_eq!(
            sorted(&today),
            [
                ("alice".to_owned(), 80, "85.00".to_owned()),
                ("alice".to_owned(), 100, "100.00".to_owned()),
                ("bob".to_owned(), 80, "80.00".to_owned()),
                ("bob".to_owned(), 100, "100.00".to_owned()),
            ]
        );
        let day = chrono::Utc::now().date_naive().to_string();
        for d in &today {
            assert_eq!(d["budget"], "100.00");
            assert_eq!(d["currency"], "USD");
            assert_eq!(d["day"], day.as_str());
        }
        assert_eq!(
            s.db.count("SELECT count(*) FROM budget_thresholds", None)
                .await,
            4
        );

        // The next day (today's rows moved to yesterday): alice's own crossings again.
        s.db.execute("UPDATE budgets SET day = day - 1").await;
        s.db.execute("UPDATE budget_thresholds SET day = day - 1")
            .await;
        let reply = s.checkout_of("A-6", "100.00", &as_alice).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        until("6 events are delivered", async || {
            receiver.delivered().len() >= 6
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let all = crossings(&receiver);
        assert_eq!(all.len(), 6, "{all:?}");
        assert_eq!(
            sorted(&all),
            [
                ("alice".to_owned(), 80, "100.00".to_owned()),
                ("alice".to_owned(), 80, "85.00".to_owned()),
                ("alice".to_owned(), 100, "100.00".to_owned()),
                ("alice".to_owned(), 100, "100.00".to_owned()),
                ("bob".to_owned(), 80, "80.00".to_owned()),
                ("bob".to_owned(), 100, "100.00".to_owned()),
            ]
        );
        assert_eq!(
            s.db.count(
                "SELECT count(*) FROM webhook_events WHERE type = 'budget.threshold'",
                None
            )
            .await,
            6
        );
        assert_eq!(
            s.db.count("SELECT count(*) FROM budget_thresholds", None)
                .await,
            6
        );
    }
);

// Two processes on one Postgres, thirty checkouts of 10.00 racing for a budget of 100.00:
// one 80 and one 100 in all. (SQLite serves one process.)
// Seen failing: with the same two changes as above, 4 events where 2 (80 again at 90.00
// and at 100.00).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_checkouts_on_two_processes_announce_each_threshold_once() {
    use crate::common::{Process, TestDb, client, post, scripted};
    let db = TestDb::new(Backend::Postgres).await;
    let model = scripted("").await;
    let env = [
        ("DATABASE_URL", db.url.as_str()),
        ("OPENAI_BASE_URL", &*model.base_url()),
        ("CHECKOUT_BUDGET_PER_DAY", "USD:100.00"),
        ("CHECKOUT_WEBHOOK_URL", "http://127.0.0.1:9/hooks"),
        ("CHECKOUT_WEBHOOK_SECRET", SECRET),
        ("CHECKOUT_WEBHOOK_EVENTS", "budget.threshold"),
    ];
    let instances = Arc::new([Process::start(&env), Process::start(&env)]);
    let http = client();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..30 {
        let (instances, http) = (instances.clone(), http.clone());
        tasks.spawn(async move {
            let url = instances[i % 2].url(&format!("/checkout?orderId=TB-{i}&amount=10.00"));
            post(&http, &url, &[], None).await.status
        });
    }
    let statuses = tasks.join_all().await;
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 10);
    let events = db
        .count(
            "SELECT count(*) FROM webhook_events WHERE type = 'budget.threshold'",
            None,
        )
        .await;
    assert_eq!(events, 2, "one 80, one 100");
    assert_eq!(
        db.count(
            "SELECT count(*) FROM budget_thresholds WHERE threshold = 80",
            None
        )
        .await,
        1
    );
}
