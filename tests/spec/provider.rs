//! A payment provider (`CHECKOUT_PAYMENT_PROVIDER=stripe`) against the Stripe-compatible
//! fake (`common::stripe`): an intent committed before the call, the charge key + attempt
//! as the provider's Idempotency-Key, re-sent with the same parameters by every retry, and
//! one provider execution and one receipt per order, whatever fails where.

use std::time::Duration;

use crate::common::stripe::{Fault, StripeFake};
use crate::common::{
    Backend, Harness, Process, Reply, TestDb, client, post, scripted, settled, through_stripe,
};
use checkout::config::Settings;
use checkout::model::scripted::ScriptedModel;

const KEY_1: &str = "checkout:P-1:attempt:1";

async fn harness(backend: Backend, fake: &StripeFake, tune: impl FnOnce(&mut Settings)) -> Harness {
    let base = fake.base_url();
    Harness::with(backend, "", |s| {
        through_stripe(s, &base);
        tune(s);
    })
    .await
}

async fn intents(h: &Harness, status: &'static str) -> i64 {
    h.db.count(
        match status {
            "pending" => "SELECT count(*) FROM payment_intents WHERE status = 'pending'",
            "succeeded" => "SELECT count(*) FROM payment_intents WHERE status = 'succeeded'",
            "declined" => "SELECT count(*) FROM payment_intents WHERE status = 'declined' AND decline_code = 'generic_decline'",
            "requires_action" => {
                "SELECT count(*) FROM payment_intents WHERE status = 'requires_action'"
            }
            _ => "SELECT count(*) FROM payment_intents",
        },
        None,
    )
    .await
}

async fn pay(h: &Harness, order: &str, method: &str, key: Option<&str>) -> Reply {
    let path = format!("/checkout?orderId={order}&amount=42.50&paymentMethod={method}");
    match key {
        Some(key) => h.post(&path, &[("idempotency-key", key)], None).await,
        None => h.post(&path, &[], None).await,
    }
}

both_backends!(
    a_charge_sends_its_intent_once_and_the_receipt_keeps_the_payment_id,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |_| {}).await;
        let reply = pay(&h, "P-1", "pm_card_visa", None).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let body = reply.json();
        assert_eq!(body["charged"], true);
        assert_eq!(fake.executions(), 1);
        assert_eq!(fake.keys(), [KEY_1]);
        assert_eq!(fake.requests_of(KEY_1), 1);
        let payment = fake.intents()[0]["id"].as_str().unwrap().to_owned();
        assert_eq!(body["receipt"]["paymentId"], payment.as_str());
        let operation = body["operationKey"].as_str().unwrap();
        let mut expected: Vec<(String, String)> = [
            ("amount", "4250"),
            ("confirm", "true"),
            ("currency", "usd"),
            ("metadata[attempt]", "1"),
            ("metadata[operation_key]", operation),
            ("metadata[order_id]", "P-1"),
            ("payment_method", "pm_card_visa"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        expected.sort();
        assert_eq!(fake.forms(), [expected]);
        assert_eq!(fake.authorizations(), ["Bearer sk_test_fake"]);
        assert_eq!(h.db.receipts("P-1").await, 1);
        assert_eq!(
            h.db.count(
                "SELECT count(*) FROM receipts WHERE provider_payment_id LIKE 'pi_fake%'",
                None
            )
            .await,
            1
        );
        assert_eq!(intents(&h, "succeeded").await, 1);
        assert_eq!(intents(&h, "all").await, 1);
        let receipt = h.get("/receipts/P-1").await.json();
        assert_eq!(receipt["paymentId"], payment.as_str());
    }
);

both_backends!(
    payment_method_is_required_with_the_provider_and_checked_always,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |_| {}).await;
        let missing = h.checkout("P-1", "42.50").await;
        let problem = missing.problem(400);
        assert_eq!(problem["field"], "paymentMethod", "{problem}");
        let bad = h
            .post(
                "/checkout?orderId=P-1&amount=42.50&paymentMethod=card_visa",
                &[],
                None,
            )
            .await;
        assert_eq!(bad.problem(400)["field"], "paymentMethod");
        assert_eq!(
            (fake.executions(), h.model.requests()),
            (0, 0),
            "nothing asked"
        );
        assert_eq!(intents(&h, "all").await, 0);
        assert_eq!(h.db.all_receipts().await, 0);

        let ledger = Harness::start(backend).await;
        assert_eq!(ledger.checkout("L-1", "1.00").await.status, 200);
        let bad = ledger
            .post(
                "/checkout?orderId=L-2&amount=1.00&paymentMethod=pm_",
                &[],
                None,
            )
            .await;
        assert_eq!(bad.problem(400)["field"], "paymentMethod");
        assert_eq!(ledger.db.all_receipts().await, 1);
    }
);

// Each fault after the provider executed the charge: the repeats carry the same key and
// parameters, so the provider executes it once and the order has one receipt.
both_backends!(
    faults_after_the_provider_executed_settle_with_one_execution,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |s| {
            s.payments.timeout = Duration::from_millis(1_000);
        })
        .await;
        // The connection dropped before the answer: re-sent, the saved answer comes back.
        fake.fail_next(Fault::DropAnswer);
        let reply = pay(&h, "P-1", "pm_card_visa", None).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!((fake.executions_of(KEY_1), fake.requests_of(KEY_1)), (1, 2));
        // The answer came too late: re-sent after the provider timeout, saved answer.
        fake.fail_next(Fault::DelayAnswer(Duration::from_millis(4_000)));
        let reply = pay(&h, "P-2", "pm_card_visa", None).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let key = "checkout:P-2:attempt:1";
        assert_eq!((fake.executions_of(key), fake.requests_of(key)), (1, 2));
        // A 500 after executing is saved: every repeat gets it (1 + 2 retries); the
        // look-up by metadata finds the payment.
        fake.fail_next(Fault::Answer500);
        let reply = pay(&h, "P-3", "pm_card_visa", None).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let key = "checkout:P-3:attempt:1";
        assert_eq!((fake.executions_of(key), fake.requests_of(key)), (1, 3));
        assert_eq!(fake.searches(), 1);
        assert_eq!(fake.executions(), 3);
        assert_eq!(h.db.all_receipts().await, 3);
        assert_eq!(intents(&h, "succeeded").await, 3);
    }
);

// Two checkouts of one order at once: the second finds the first's intent open and
// sends its key while the first request executes (409 `idempotency_key_in_use`),
// retries, and gets the saved answer.
both_backends!(
    concurrent_checkouts_of_one_order_share_one_intent_and_one_execution,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |s| {
            s.payments.timeout = Duration::from_millis(5_000);
            // One provider retry, well after the first request's execution (held 2 s):
            // the second checkout is told in_use once, then gets the saved answer.
            s.payments.backoff_min = Duration::from_millis(4_000);
            s.payments.backoff_max = Duration::from_millis(4_000);
            s.assistant.retry.timeout = Duration::from_millis(10_000);
        })
        .await;
        fake.fail_next(Fault::DelayExecution(Duration::from_millis(2_000)));
        let (a, b) = tokio::join!(pay(&h, "P-1", "pm_card_visa", Some("first")), async {
            crate::common::until("the first request is at the provider", async || {
                fake.requests_of(KEY_1) == 1
            })
            .await;
            pay(&h, "P-1", "pm_card_visa", Some("second")).await
        });
        assert_eq!(
            (a.status, b.status),
            (200, 200),
            "{} {}",
            a.text(),
            b.text()
        );
        assert_eq!(
            (a.json()["charged"].clone(), b.json()["charged"].clone()),
            (true.into(), false.into()),
            "the first operation made the charge"
        );
        assert_eq!(fake.executions(), 1);
        assert_eq!(
            fake.requests_of(KEY_1),
            3,
            "the first's, the second's (409 in_use), the second's retry (the saved answer)"
        );
        let scrape = h.get("/metrics").await.text();
        for line in [
            "checkout_provider_requests_total{operation=\"create\",outcome=\"in_use\"} 1",
            "checkout_provider_requests_total{operation=\"create\",outcome=\"succeeded\"} 2",
            "checkout_retries_total{layer=\"provider\",reason=\"in_use\"} 1",
        ] {
            assert!(scrape.contains(line), "{line}: {scrape}");
        }
        assert_eq!(h.db.receipts("P-1").await, 1);
        assert_eq!(intents(&h, "all").await, 1);
    }
);

both_backends!(
    the_loop_retry_after_a_provider_delay_past_the_loop_timeout_re_sends_the_same_key,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |s| {
            s.payments.timeout = Duration::from_millis(10_000);
            s.assistant.retry.timeout = Duration::from_millis(2_500);
        })
        .await;
        fake.fail_next(Fault::DelayAnswer(Duration::from_millis(8_000)));
        let reply = pay(&h, "P-1", "pm_card_visa", None).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["attempts"], 2, "{}", reply.text());
        assert_eq!((fake.executions_of(KEY_1), fake.requests_of(KEY_1)), (1, 2));
        assert_eq!(fake.executions(), 1);
        assert_eq!(h.db.receipts("P-1").await, 1);
    }
);

// No retry of ours got an outcome (the connection dropped, the look-up failed): 502,
// the intent stays pending. The client's retry with the same Idempotency-Key re-sends
// the same key and parameters and gets the saved answer.
both_backends!(
    the_clients_retry_settles_the_pending_intent_with_one_execution,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |s| {
            s.payments.max_retries = 0;
            s.assistant.retry.max_retries = 0;
        })
        .await;
        fake.fail_next(Fault::DropAnswer);
        fake.fail_searches(1);
        let lost = pay(&h, "P-1", "pm_card_visa", Some("k-1")).await;
        let problem = lost.problem(502);
        assert_eq!(problem["code"], "provider_error", "{problem}");
        assert_eq!(
            problem["orderCharged"],
            serde_json::Value::Null,
            "the provider may have charged it: unknown, {problem}"
        );
        assert_eq!(intents(&h, "pending").await, 1);
        assert_eq!(h.db.receipts("P-1").await, 0);

        let reply = pay(&h, "P-1", "pm_card_visa", Some("k-1")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["charged"], true);
        assert_eq!((fake.executions_of(KEY_1), fake.requests_of(KEY_1)), (1, 2));
        assert_eq!(fake.executions(), 1);
        assert_eq!(h.db.receipts("P-1").await, 1);
        assert_eq!(intents(&h, "succeeded").await, 1);
    }
);

// Beyond the provider's key retention an open intent is not sent again: it is looked
// up by its metadata.
both_backends!(
    an_intent_older_than_the_key_retention_is_looked_up_never_sent_again,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |s| {
            s.payments.max_retries = 0;
            s.assistant.retry.max_retries = 0;
            s.payments.key_retention = Duration::ZERO;
        })
        .await;
        fake.fail_next(Fault::DropAnswer);
        fake.fail_searches(1);
        assert_eq!(
            pay(&h, "P-1", "pm_card_visa", Some("k-1")).await.status,
            502
        );
        assert_eq!(intents(&h, "pending").await, 1);

        let reply = pay(&h, "P-1", "pm_card_visa", Some("k-1")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(
            (fake.executions_of(KEY_1), fake.requests_of(KEY_1)),
            (1, 1),
            "not re-sent"
        );
        assert_eq!(fake.searches(), 2);
        assert_eq!(h.db.receipts("P-1").await, 1);
    }
);

// Beyond the key retention, a look-up that finds no payment settles the attempt as
// absent (nothing was charged under it): the next checkout makes attempt 2.
both_backends!(
    an_old_intent_the_provider_never_executed_is_absent_and_the_next_checkout_makes_a_new_attempt,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |s| {
            s.payments.max_retries = 0;
            s.assistant.retry.max_retries = 0;
            s.payments.key_retention = Duration::ZERO;
        })
        .await;
        fake.fail_next(Fault::FailBeforeExecuting);
        let lost = pay(&h, "P-1", "pm_card_visa", Some("k-1")).await;
        assert_eq!(lost.problem(502)["code"], "provider_error");
        assert_eq!(intents(&h, "pending").await, 1);

        let absent = pay(&h, "P-1", "pm_card_visa", Some("k-1")).await;
        let problem = absent.problem(502);
        assert_eq!(problem["code"], "provider_error", "{problem}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("no payment of it was found"),
            "{problem}"
        );
        assert_eq!(
            h.db.count(
                "SELECT count(*) FROM payment_intents WHERE status = 'absent'",
                None
            )
            .await,
            1
        );
        assert_eq!(fake.requests_of(KEY_1), 1, "not re-sent");

        let reply = pay(&h, "P-1", "pm_card_visa", Some("k-1")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(fake.keys(), ["checkout:P-1:attempt:2"]);
        assert_eq!(fake.executions(), 1);
        assert_eq!(h.db.receipts("P-1").await, 1);
    }
);

both_backends!(
    a_decline_ends_the_attempt_and_a_new_checkout_makes_a_new_one,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |_| {}).await;
        let declined = pay(&h, "P-1", "pm_card_chargeDeclined", Some("k-1")).await;
        let problem = declined.problem(402);
        assert_eq!(problem["code"], "payment_declined", "{problem}");
        assert_eq!(problem["declineCode"], "generic_decline", "{problem}");
        assert!(
            problem["paymentId"].as_str().unwrap().starts_with("pi_"),
            "{problem}"
        );
        assert_eq!(
            problem["attempts"], 1,
            "the loop retry does not repeat a decline"
        );
        assert_eq!(intents(&h, "declined").await, 1);
        assert_eq!(h.db.receipts("P-1").await, 0);
        // The same operation again: its answer, nothing sent.
        let again = pay(&h, "P-1", "pm_card_chargeDeclined", Some("k-1")).await;
        assert_eq!(again.body, declined.body);
        assert_eq!(fake.executions(), 1);

        let reply = pay(&h, "P-1", "pm_card_visa", Some("k-2")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(fake.executions(), 2);
        assert_eq!(fake.keys(), [KEY_1, "checkout:P-1:attempt:2"]);
        assert_eq!(h.db.receipts("P-1").await, 1);
        assert_eq!(intents(&h, "succeeded").await, 1);
    }
);

both_backends!(
    a_payment_that_needs_3d_secure_answers_402_with_its_payment_id,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |_| {}).await;
        let reply = pay(&h, "P-1", "pm_card_authenticationRequired", None).await;
        let problem = reply.problem(402);
        assert_eq!(problem["code"], "payment_requires_action", "{problem}");
        assert_eq!(problem["paymentId"], fake.intents()[0]["id"], "{problem}");
        assert_eq!(fake.executions(), 1);
        assert_eq!(intents(&h, "requires_action").await, 1);
        assert_eq!(h.db.receipts("P-1").await, 0);
    }
);

// The provider says a key was first sent with other parameters: never our doing (a key
// goes only with its intent's parameters), so a bug: 502, logged, counted, not retried,
// nothing charged again. Made here by changing the pending intent's amount, as a bug
// might.
both_backends!(
    the_same_key_with_other_parameters_is_a_bug_answered_502,
    |backend| async move {
        let fake = StripeFake::start().await;
        let h = harness(backend, &fake, |s| {
            s.payments.max_retries = 0;
            s.assistant.retry.max_retries = 0;
        })
        .await;
        fake.fail_next(Fault::DropAnswer);
        fake.fail_searches(1);
        assert_eq!(
            pay(&h, "P-1", "pm_card_visa", Some("k-1")).await.status,
            502
        );
        assert_eq!(
            h.db.execute("UPDATE payment_intents SET amount_minor = amount_minor + 1")
                .await,
            1
        );
        let reply = pay(&h, "P-1", "pm_card_visa", Some("k-1")).await;
        let problem = reply.problem(502);
        assert_eq!(problem["code"], "provider_error", "{problem}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("first used with other parameters"),
            "{problem}"
        );
        assert_eq!(problem["attempts"], 1, "{problem}");
        assert_eq!(fake.executions(), 1);
        assert_eq!(fake.requests_of(KEY_1), 2);
        assert_eq!(fake.searches(), 1, "a refusal is not looked up");
        assert_eq!(h.db.receipts("P-1").await, 0);
        let scrape = h.get("/metrics").await.text();
        assert!(
            scrape.contains(
                "checkout_provider_requests_total{operation=\"create\",outcome=\"idempotency_error\"} 1"
            ),
            "{scrape}"
        );
    }
);

/// A checkout with an Idempotency-Key whose instance is killed (SIGKILL) after the
/// provider executed its charge and before the receipt was committed: where the two
/// tests below start. On Postgres, `with_peer` starts the other instance first, so it is
/// running while the first dies.
struct Killed {
    fake: StripeFake,
    db: TestDb,
    env: Vec<(&'static str, String)>,
    peer: Option<Process>,
    _model: ScriptedModel,
}

const KILLED_URL: &str = "/checkout?orderId=P-1&amount=42.50&paymentMethod=pm_card_visa";

impl Killed {
    async fn start(backend: Backend, key: &'static str, with_peer: bool) -> Killed {
        let fake = StripeFake::start().await;
        let model = scripted("").await;
        let db = TestDb::new(backend).await;
        let env = vec![
            ("DATABASE_URL", db.url.clone()),
            ("OPENAI_BASE_URL", model.base_url()),
            ("CHECKOUT_PAYMENT_PROVIDER", "stripe".into()),
            ("STRIPE_BASE_URL", fake.base_url()),
            ("STRIPE_API_KEY", "sk_test_fake".into()),
            ("CHECKOUT_PROVIDER_TIMEOUT_MS", "20000".into()),
            ("CHECKOUT_IDEMPOTENCY_LEASE_MS", "1000".into()),
            ("CHECKOUT_LOOP_TIMEOUT_MS", "30000".into()),
        ];
        let mut killed = Killed {
            fake,
            db,
            env,
            peer: None,
            _model: model,
        };
        let mut victim = Process::start(&killed.env());
        if with_peer && backend == Backend::Postgres {
            killed.peer = Some(Process::start(&killed.env()));
        }
        killed
            .fake
            .fail_next(Fault::DelayAnswer(Duration::from_secs(60)));
        let lost = {
            let (http, url) = (client(), victim.url(KILLED_URL));
            tokio::spawn(async move { post(&http, &url, &[("idempotency-key", key)], None).await })
        };
        crate::common::until("the provider executed the charge", async || {
            killed.fake.executions() == 1
        })
        .await;
        victim.signal("KILL");
        victim.wait(Duration::from_secs(5));
        drop(victim);
        let _ = lost.await;
        assert_eq!(
            killed.db.receipts("P-1").await,
            0,
            "killed before the receipt"
        );
        killed
    }

    fn env(&self) -> Vec<(&str, &str)> {
        self.env.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    /// The other instance: the one started first, or a new one.
    fn survivor(&mut self) -> Process {
        self.peer
            .take()
            .unwrap_or_else(|| Process::start(&self.env()))
    }
}

// The client's retry goes to another instance (on SQLite, a new process on the same
// file), which finds the intent open and re-sends its key: one execution, one receipt.
both_backends!(
    killed_after_the_provider_executed_the_retry_to_another_instance_settles_it,
    |backend| async move {
        let mut killed = Killed::start(backend, "crash-key", true).await;
        let survivor = killed.survivor();
        let key = [("idempotency-key", "crash-key")];
        let http = client();
        let reply =
            settled(async || post(&http, &survivor.url(KILLED_URL), &key, None).await).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["charged"], true, "{}", reply.text());
        assert_eq!(killed.fake.executions(), 1);
        assert_eq!(killed.fake.requests_of(KEY_1), 2);
        assert_eq!(killed.db.receipts("P-1").await, 1);
        assert_eq!(killed.db.all_receipts().await, 1);
    }
);

// The same crash with no client to retry: the recovery sweep of a live instance takes the
// lapsed operation over, resumes it from its journal, and its charge tool finds the intent
// open and re-sends its key: one execution, one receipt, and the answer saved for the
// client's retry, which gets it replayed.
both_backends!(
    killed_after_the_provider_executed_the_recovery_sweep_settles_it,
    |backend| async move {
        let mut killed = Killed::start(backend, "swept-key", false).await;
        let survivor = killed.survivor();
        crate::common::until("the sweep settled the charge", async || {
            killed.db.receipts("P-1").await == 1
        })
        .await;
        assert_eq!(killed.fake.executions(), 1);
        assert_eq!(killed.fake.requests_of(KEY_1), 2);
        // The sweep holds the key (409 in_flight) until the model has confirmed and the
        // answer is saved.
        let key = [("idempotency-key", "swept-key")];
        let http = client();
        let reply =
            settled(async || post(&http, &survivor.url(KILLED_URL), &key, None).await).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.header("idempotent-replayed"), Some("true"));
        assert_eq!(reply.json()["charged"], true, "{}", reply.text());
        assert_eq!(killed.fake.executions(), 1);
        assert_eq!(killed.db.all_receipts().await, 1);
    }
);
