//! The journal: a retry resumes the loop instead of restarting it. Through HTTP with the
//! scripted model, on both stores: the client's retry with its Idempotency-Key, a journal
//! made under other pins, a journal that does not match, its expiry; and the lease's
//! fence on the journal itself. (The loop retry's resume is the fault matrix's first
//! column; another instance after a SIGKILL is in `crash`.)

use std::time::Duration;

use crate::common::{Backend, Harness, Reply, TestDb};
use checkout::db::{Database, PoolSettings};
use checkout::http::OperationRef;
use checkout::http::checkout::CheckoutRequest;
use checkout::http::extract::Format;
use checkout::idempotency::{self, Begin, Records};
use checkout::journal::{EntryKind, Journal, JournalKey, NewEntry};
use checkout::payments::{Currency, Money, Order, OrderId};

const KEY: (&str, &str) = ("idempotency-key", "journal-key");

/// The state a crash after the charge leaves (tests/spec/crash.rs makes it with a real
/// SIGKILL): the operation's record in flight with its lease lapsed, its journal holding
/// round 1's answer and the charge's result, round 2's answer never journaled. Made here
/// from a whole run by taking back what came after the charge, since a paid order is
/// never answered as an error and so no failure after the charge leaves its key open.
/// The recovery sweep is off, so that the client's retry is what resumes.
async fn failed_after_the_charge(backend: Backend, journal: bool) -> Harness {
    let h = Harness::with(backend, "", |s| {
        s.assistant.journal = journal;
        s.idempotency.recovery = false;
    })
    .await;
    assert_eq!(keyed(&h).await.status, 200);
    assert_eq!(h.db.receipts("J-1").await, 1);
    assert_eq!(h.model.requests(), 2);
    let reopened = h
        .db
        .execute(
            "UPDATE idempotency_keys SET status = NULL, content_type = NULL, body = NULL, lease_until = 0 WHERE key = 'journal-key'",
        )
        .await;
    assert_eq!(reopened, 1);
    h.db.execute("DELETE FROM agent_journal WHERE step > 2")
        .await;
    h
}

async fn keyed(h: &Harness) -> Reply {
    h.post("/checkout?orderId=J-1&amount=42.50", &[KEY], None)
        .await
}

async fn journal_rows(h: &Harness) -> i64 {
    h.db.count("SELECT count(*) FROM agent_journal", None).await
}

both_backends!(
    a_clients_retry_with_the_same_key_resumes_after_the_charge,
    |backend| async move {
        let h = failed_after_the_charge(backend, true).await;
        assert_eq!(
            journal_rows(&h).await,
            2,
            "round 1's answer, the charge's result"
        );
        let reply = keyed(&h).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let body = reply.json();
        assert_eq!(body["charged"], true);
        assert_eq!(h.db.receipts("J-1").await, 1);
        // Only round 2 is asked again.
        assert_eq!(h.model.requests(), 2 + 1);
        assert_eq!(
            h.model.requests_at_round(1),
            1,
            "round 1 is not asked again"
        );
        assert_eq!(body["usage"]["modelRequests"], 1, "{body}");
        assert_eq!(body["usage"]["replayedSteps"], 2, "{body}");
        assert!(body["usage"]["inputTokens"].as_u64().unwrap() > 0, "{body}");
        assert_eq!(journal_rows(&h).await, 3, "and round 2's answer");
        // The metrics say the same: one answer and one tool result replayed, and the
        // tokens the replayed answer cost when it was first asked for.
        let first_answer_tokens =
            h.db.count(
                "SELECT input_tokens + output_tokens FROM agent_journal WHERE step = 1",
                None,
            )
            .await;
        let scrape = h.get("/metrics").await.text();
        let value = |series: &str| -> i64 {
            scrape
                .lines()
                .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {series} in {scrape}"))
        };
        assert_eq!(
            value("checkout_journal_replayed_steps_total{kind=\"answer\"}"),
            1
        );
        assert_eq!(
            value("checkout_journal_replayed_steps_total{kind=\"tool\"}"),
            1
        );
        assert_eq!(
            value("checkout_journal_tokens_saved_total{type=\"input\"}")
                + value("checkout_journal_tokens_saved_total{type=\"output\"}"),
            first_answer_tokens
        );
        assert!(first_answer_tokens > 0);
    }
);

/// The same retry with the journal off starts the loop over: what the test above saves.
#[tokio::test]
async fn with_the_journal_off_the_clients_retry_starts_over() {
    let h = failed_after_the_charge(Backend::Sqlite, false).await;
    let reply = keyed(&h).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(h.model.requests(), 2 + 2);
    assert_eq!(h.model.requests_at_round(1), 2, "round 1 is asked again");
    assert_eq!(reply.json()["usage"]["replayedSteps"], 0);
    assert_eq!(h.db.receipts("J-1").await, 1);
    assert_eq!(journal_rows(&h).await, 0);
}

// The journal's first answer pins the model it was made with. Rewriting the pin stands in
// for a service restarted with another OPENAI_MODEL: the resume starts afresh, and the
// order keeps its one receipt, found again by its charge key.
both_backends!(
    a_journal_made_under_another_model_is_discarded_and_the_loop_starts_afresh,
    |backend| async move {
        let h = failed_after_the_charge(backend, true).await;
        let changed = h
            .db
            .execute(
                "UPDATE agent_journal SET pins = replace(pins, '\"model\":\"gpt-4o-mini\"', '\"model\":\"another-model\"') WHERE step = 1",
            )
            .await;
        assert_eq!(changed, 1);
        let reply = keyed(&h).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let body = reply.json();
        assert_eq!(body["charged"], true, "the receipt is this operation's");
        assert_eq!(body["usage"]["replayedSteps"], 0, "{body}");
        assert_eq!(h.model.requests_at_round(1), 2, "round 1 is asked afresh");
        assert_eq!(h.db.receipts("J-1").await, 1, "nothing new is charged");
        assert_eq!(journal_rows(&h).await, 3, "the fresh run's own steps");
    }
);

// A journal whose step names another tool than the replayed answer calls is an error:
// nothing is replayed past it, the model is not asked, nothing is charged.
both_backends!(
    a_journal_step_that_does_not_match_is_an_error_never_a_replay,
    |backend| async move {
        let h = failed_after_the_charge(backend, true).await;
        let changed =
            h.db.execute("UPDATE agent_journal SET name = 'refund' WHERE step = 2")
                .await;
        assert_eq!(changed, 1);
        let reply = keyed(&h).await;
        let problem = reply.problem(500);
        assert_eq!(problem["code"], "journal_mismatch");
        assert_eq!(
            problem["detail"]
                .as_str()
                .unwrap()
                .split(';')
                .next()
                .unwrap(),
            "the operation's journal does not match its replay at step 2: the journal has the result of tool \"refund\" (call call_1_1), the replayed answer calls \"charge\" (call call_1_1)"
        );
        assert_eq!(h.model.requests(), 2, "the model is not asked");
        assert_eq!(h.db.receipts("J-1").await, 1);
    }
);

both_backends!(
    journal_entries_are_swept_with_their_key,
    |backend| async move {
        let h = Harness::with(backend, "", |s| s.idempotency.ttl = Duration::from_secs(1)).await;
        assert_eq!(keyed(&h).await.status, 200);
        assert_eq!(journal_rows(&h).await, 3);
        tokio::time::sleep(Duration::from_millis(1_600)).await;
        assert_eq!(
            journal_rows(&h).await,
            0,
            "the sweep removed the expired steps"
        );
    }
);

/// Only the holder of the operation's lease appends: once another instance has taken
/// the key over, the first holder's entry is not written, and the new holder's is.
async fn only_the_lease_holder_appends(backend: Backend) {
    let db = TestDb::new(backend).await;
    let pool = PoolSettings {
        max_connections: 4,
        acquire_timeout: Duration::from_secs(5),
    };
    let database = Database::open(&db.url, &pool).await.unwrap();
    let wake = Default::default();
    let (records, journal) = (
        Records::new(&database, &wake),
        Journal::new(&database, &wake),
    );
    #[allow(
        clippy::disallowed_methods,
        reason = "a test's fixed order, not a request's"
    )]
    let order = Order::new(
        OrderId::parse("J-2").unwrap(),
        Money::parse("1.00", Currency::USD).unwrap(),
    );
    let fp = OperationRef::Checkout(&CheckoutRequest {
        order,
        email: None,
        format: Format::Json,
        needs_approval: false,
    })
    .fingerprint();
    let (lease, ttl) = (Duration::from_secs(30), Duration::from_secs(60));
    let begin = || idempotency::begin(&records, "", "k", &fp, lease, ttl);
    let Begin::Owner(first) = begin().await.unwrap() else {
        panic!("a new key is ours")
    };
    let entry = |fence: i64, step: i64| NewEntry {
        key: JournalKey {
            caller: String::new(),
            operation_key: "k".into(),
            fence: Some(fence),
        },
        step,
        kind: EntryKind::Answer,
        name: String::new(),
        call_id: None,
        body: format!("{{\"content\":\"written under fence {fence}\"}}"),
        pins: None,
        input_tokens: None,
        output_tokens: None,
        ttl_ms: 60_000,
    };
    assert!(journal.append(vec![entry(1, 1)]).await.unwrap());
    // The first holder goes quiet; its lease lapses and the key is taken over.
    assert!(
        records
            .renew(&first, Duration::from_millis(1))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let Begin::Owner(second) = begin().await.unwrap() else {
        panic!("a lapsed lease is taken over")
    };
    assert_eq!(second.fence, 2);
    assert!(
        !journal.append(vec![entry(1, 2)]).await.unwrap(),
        "the old holder stops"
    );
    assert!(
        journal.append(vec![entry(2, 2)]).await.unwrap(),
        "the new holder appends"
    );
    assert!(
        !journal.append(vec![entry(2, 2)]).await.unwrap(),
        "a step is written once"
    );
    let steps = journal.load("", "k").await.unwrap();
    let bodies: Vec<&str> = steps.iter().map(|e| e.body.as_str()).collect();
    assert_eq!(
        bodies,
        [
            "{\"content\":\"written under fence 1\"}",
            "{\"content\":\"written under fence 2\"}"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_appends_on_postgres() {
    only_the_lease_holder_appends(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_appends_on_sqlite() {
    only_the_lease_holder_appends(Backend::Sqlite).await;
}
