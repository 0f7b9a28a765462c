//! `Idempotency-Key` on POST /checkout, through HTTP: replay, key reuse, in-flight,
//! expiry, which outcomes are saved, and the lease with its fencing token.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Backend, Harness, Reply, TestDb, until};
use checkout::db::{Database, PoolSettings};
use checkout::http::OperationRef;
use checkout::http::checkout::CheckoutRequest;
use checkout::http::extract::Format;
use checkout::idempotency::{self, Begin, Records, Saved};
use checkout::payments::{Currency, Money, Order, OrderId};

const KEY: (&str, &str) = ("idempotency-key", "\"order-7-attempt\"");

async fn keyed(h: &Harness, order: &str, amount: &str) -> Reply {
    h.post(
        &format!("/checkout?orderId={order}&amount={amount}"),
        &[KEY],
        None,
    )
    .await
}

async fn records(h: &Harness) -> i64 {
    h.db.count("SELECT count(*) FROM idempotency_keys", None)
        .await
}

both_backends!(
    a_repeat_replays_the_first_answer_byte_for_byte,
    |backend| async move {
        let h = Harness::start(backend).await;
        let first = keyed(&h, "I-1", "42.50").await;
        assert_eq!(first.status, 200, "{}", first.text());
        assert_eq!(first.header("idempotent-replayed"), None);
        assert_eq!(first.json()["operationKey"], "order-7-attempt");
        // The same key as a bare token is the same key.
        let again = h
            .post(
                "/checkout?orderId=I-1&amount=42.50",
                &[("idempotency-key", "order-7-attempt")],
                None,
            )
            .await;
        assert_eq!(again.status, 200);
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.header("content-type"), first.header("content-type"));
        assert_eq!(again.body, first.body, "byte for byte");
        assert_eq!(h.model.requests(), 2, "the replay did not run the loop");
        assert_eq!(h.db.receipts("I-1").await, 1);
        assert_eq!(records(&h).await, 1);
    }
);

both_backends!(
    the_same_key_with_another_amount_is_422_key_reuse,
    |backend| async move {
        let h = Harness::start(backend).await;
        assert_eq!(keyed(&h, "I-2", "10.00").await.status, 200);
        let reuse = keyed(&h, "I-2", "10.01").await;
        assert_eq!(reuse.problem(422)["code"], "key_reuse");
        let reuse = keyed(&h, "I-3", "10.00").await;
        assert_eq!(reuse.problem(422)["code"], "key_reuse");
        assert_eq!(h.model.requests(), 2);
        assert_eq!(h.db.all_receipts().await, 1);
    }
);

both_backends!(
    a_key_still_running_is_409_in_flight_with_retry_after,
    |backend| async move {
        let h = Arc::new(Harness::with(backend, "slow=300@1x1", |_| {}).await);
        let first = tokio::spawn({
            let h = h.clone();
            async move { keyed(&h, "I-4", "3.00").await }
        });
        until("round 1 is asked", async || h.model.requests() > 0).await;
        let busy = keyed(&h, "I-4", "3.00").await;
        assert_eq!(busy.problem(409)["code"], "in_flight");
        assert_eq!(
            busy.header("retry-after"),
            Some("1"),
            "the lease (1 s in tests) ends within a second"
        );
        let first = first.await.unwrap();
        assert_eq!(first.status, 200);
        let replay = keyed(&h, "I-4", "3.00").await;
        assert_eq!(replay.body, first.body);
        assert_eq!(h.model.requests(), 2);
    }
);

both_backends!(
    twenty_concurrent_requests_with_one_key_run_the_loop_once,
    |backend| async move {
        let h = Arc::new(Harness::with(backend, "slow=300@1x1", |_| {}).await);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let h = h.clone();
            tasks.spawn(async move { keyed(&h, "I-5", "20.00").await });
        }
        let mut answers = Vec::new();
        while let Some(reply) = tasks.join_next().await {
            answers.push(reply.unwrap());
        }
        let ok: Vec<&Reply> = answers.iter().filter(|r| r.status == 200).collect();
        let busy = answers
            .iter()
            .filter(|r| r.status == 409 && r.json()["code"] == "in_flight")
            .count();
        assert_eq!(
            (ok.len(), busy),
            (1, 19),
            "one runs, nineteen are told it is in flight"
        );
        assert_eq!(h.model.requests(), 2, "one loop run");
        assert_eq!(h.db.receipts("I-5").await, 1);
        let replay = keyed(&h, "I-5", "20.00").await;
        assert_eq!(replay.body, ok[0].body);
    }
);

#[tokio::test]
async fn a_transient_failure_is_not_saved_and_the_key_stays_usable() {
    let h = Harness::with(Backend::Sqlite, "503@1x3", |s| {
        s.assistant.retry.max_retries = 0
    })
    .await;
    let failed = keyed(&h, "I-6", "1.00").await;
    assert_eq!(failed.problem(502)["code"], "model_error");
    let retried = keyed(&h, "I-6", "1.00").await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert_eq!(retried.header("idempotent-replayed"), None, "it ran again");
    assert_eq!(retried.json()["charged"], true);
    assert_eq!(h.model.requests(), 3 + 2);
    assert_eq!(h.db.receipts("I-6").await, 1);
}

#[tokio::test]
async fn final_failures_are_saved_and_replayed() {
    // No nudge: the model's first answer is its last, a final 502.
    let h = Harness::with(Backend::Sqlite, "no-charge@1x1", |s| {
        s.assistant.max_nudges = 0
    })
    .await;
    let refused = keyed(&h, "I-7", "1.00").await;
    assert_eq!(refused.problem(502)["code"], "model_did_not_charge");
    let replay = keyed(&h, "I-7", "1.00").await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!((replay.status, &replay.body), (502, &refused.body));
    assert_eq!(h.model.requests(), 1);

    assert_eq!(h.checkout("I-8", "5.00").await.status, 200);
    let key = [("idempotency-key", "conflict-1")];
    let conflict = h
        .post("/checkout?orderId=I-8&amount=6.00", &key, None)
        .await;
    assert_eq!(conflict.problem(409)["code"], "amount_conflict");
    let replay = h
        .post("/checkout?orderId=I-8&amount=6.00", &key, None)
        .await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body, conflict.body);
    assert_eq!(h.model.requests(), 1 + 2 + 1);
}

#[tokio::test]
async fn invalid_requests_and_keyless_requests_record_nothing() {
    let h = Harness::start(Backend::Sqlite).await;
    assert_eq!(
        h.post("/checkout?orderId=I-9&amount=-1", &[KEY], None)
            .await
            .status,
        400
    );
    assert_eq!(h.checkout("I-9", "1.00").await.status, 200);
    assert_eq!(records(&h).await, 0);
}

both_backends!(keys_expire_and_are_swept, |backend| async move {
    let h = Harness::with(backend, "", |s| s.idempotency.ttl = Duration::from_secs(1)).await;
    assert_eq!(keyed(&h, "I-10", "1.00").await.status, 200);
    assert_eq!(records(&h).await, 1);
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert_eq!(records(&h).await, 0, "the sweep removed the expired key");
    // Forgotten: the key may now name a new request.
    let reply = keyed(&h, "I-11", "2.00").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("idempotent-replayed"), None);
    assert_eq!(h.db.all_receipts().await, 2);
});

/// The lease and its fence, straight against the records of each database.
async fn lease_and_fence(backend: Backend) {
    let db = TestDb::new(backend).await;
    let pool = PoolSettings {
        max_connections: 4,
        acquire_timeout: Duration::from_secs(5),
    };
    let database = Database::open(&db.url, &pool).await.unwrap();
    let store = Records::new(&database, &Default::default());
    #[allow(
        clippy::disallowed_methods,
        reason = "a test's fixed order, not a request's"
    )]
    let order = Order::new(
        OrderId::parse("L-1").unwrap(),
        Money::parse("1.00", Currency::USD).unwrap(),
    );
    let fp = OperationRef::Checkout(&CheckoutRequest {
        order,
        email: None,
        format: Format::Json,
        needs_approval: false,
    })
    .fingerprint();
    // A lease far longer than any pause a loaded machine makes between two
    // statements: while it holds, the key is in flight whatever the timing.
    let (lease, ttl) = (Duration::from_secs(30), Duration::from_secs(60));
    let begin = || idempotency::begin(&store, "", "k", &fp, lease, ttl);

    let Begin::Owner(first) = begin().await.unwrap() else {
        panic!("a new key is ours")
    };
    assert_eq!(first.fence, 1);
    assert!(matches!(begin().await.unwrap(), Begin::InFlight { .. }));
    // The last renewal is a short one; a slow machine only makes it lapse surer.
    assert!(store.renew(&first, Duration::from_millis(1)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(50)).await;

    // The first owner went quiet; its lease lapsed and the key is taken over.
    let Begin::Owner(second) = begin().await.unwrap() else {
        panic!("a lapsed lease is taken over")
    };
    assert_eq!(second.fence, 2);
    // The zombie wakes up: it can neither renew nor write its answer.
    let late = Saved {
        status: 200,
        content_type: "text/plain".into(),
        body: b"late".to_vec(),
    };
    assert!(!store.renew(&first, lease).await.unwrap());
    assert!(!store.complete(&first, &late, Vec::new()).await.unwrap());
    assert!(!store.release(&first).await.unwrap());
    let saved = Saved {
        status: 200,
        content_type: "text/plain".into(),
        body: b"owner".to_vec(),
    };
    assert!(store.complete(&second, &saved, Vec::new()).await.unwrap());
    assert_eq!(begin().await.unwrap(), Begin::Replay(saved));
    // A finished key is not taken over, even long after its lease.
    assert!(!store.renew(&second, lease).await.unwrap());
    assert_eq!(store.sweep(Duration::from_secs(3600)).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_is_taken_over_and_the_zombie_cannot_write_on_postgres() {
    lease_and_fence(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_is_taken_over_and_the_zombie_cannot_write_on_sqlite() {
    lease_and_fence(Backend::Sqlite).await;
}
