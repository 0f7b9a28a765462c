//! A person above an amount: a charge over `CHECKOUT_APPROVAL_ABOVE` waits for a decision,
//! and whatever happens around the pause (a repeat, two deciders, both decisions at once,
//! a crash while paused or right after the approval, the expiry) the order is charged
//! exactly once if approved, and never otherwise.
//!
//! SQLite allows one instance per file (the service locks it), so the races run within
//! one instance there and across two on Postgres.

use std::time::Duration;

use checkout::config::Settings;
use checkout::model::scripted::ScriptedModel;
use checkout::payments::PerCurrency;
use serde_json::Value;

use crate::common::Instance;
use crate::common::{
    Backend, Harness, Process, Reply, TestDb, client, post, scripted, settled, test_settings, until,
};

const KEY: (&str, &str) = ("idempotency-key", "big-order-1");

fn with_approval(s: &mut Settings) {
    s.payments.approval_above = PerCurrency::parse("USD:100.00").unwrap();
}

/// The service with approvals above USD 100.00, the model following `faults`; on
/// Postgres, with a second instance on the same database (`None` on SQLite).
async fn service(
    backend: Backend,
    faults: &str,
    tune: impl Fn(&mut Settings),
) -> (Harness, Option<Instance>) {
    let db = TestDb::new(backend).await;
    let model: ScriptedModel = scripted(faults).await;
    let mut settings = test_settings(&db, &model);
    with_approval(&mut settings);
    tune(&mut settings);
    let second = match backend {
        Backend::Postgres => Some(Instance::start(settings.clone()).await),
        Backend::Sqlite => None,
    };
    (Harness::serve(db, model, settings).await, second)
}

/// The other instance's base URL, or this one's on SQLite.
fn other(h: &Harness, second: &Option<Instance>) -> String {
    second.as_ref().map_or(h.base.clone(), |s| s.base.clone())
}

/// Asks for a checkout of `amount` with the Idempotency-Key `key`; it must pause.
async fn paused(h: &Harness, order: &str, amount: &str, key: &str) -> Value {
    let reply = h
        .post(
            &format!("/checkout?orderId={order}&amount={amount}"),
            &[("idempotency-key", key)],
            None,
        )
        .await;
    assert_eq!(reply.status, 202, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["status"], "requires_approval");
    assert_eq!(body["approval"]["status"], "pending");
    let id = body["approval"]["id"].as_str().unwrap();
    assert_eq!(
        reply.header("location"),
        Some(format!("/approvals/{id}").as_str())
    );
    body
}

async fn decide(base: &str, id: &str, decision: &str, body: Option<&str>) -> Reply {
    post(
        &client(),
        &format!("{base}/approvals/{id}/{decision}"),
        &[],
        body,
    )
    .await
}

both_backends!(
    a_charge_above_the_threshold_waits_and_its_approval_charges_once,
    |backend| async move {
        let (h, _) = service(backend, "", |_| {}).await;
        let body = paused(&h, "BIG-1", "500.00", KEY.1).await;
        let id = body["approval"]["id"].as_str().unwrap().to_owned();
        assert_eq!(body["operationKey"], KEY.1);
        assert_eq!(
            h.db.receipts("BIG-1").await,
            0,
            "nothing is charged while paused"
        );
        assert_eq!(h.model.requests(), 1, "the model asked for the charge once");

        // The client repeating its POST is told it still waits, and nothing runs.
        let again = h
            .post("/checkout?orderId=BIG-1&amount=500.00", &[KEY], None)
            .await;
        assert_eq!(again.status, 202);
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(
            again.header("location"),
            Some(format!("/approvals/{id}").as_str())
        );
        let operation = h.get(&format!("/operations/{}", KEY.1)).await;
        assert_eq!(operation.status, 202);
        assert_eq!(operation.json()["approval"]["id"], id.as_str());
        let listed = h.get("/approvals?status=pending").await.json();
        assert_eq!(listed["approvals"].as_array().unwrap().len(), 1);
        assert_eq!(h.model.requests(), 1);

        let approved = decide(&h.base, &id, "approve", None).await;
        assert_eq!(approved.status, 200, "{}", approved.text());
        let answer = approved.json();
        assert_eq!(answer["charged"], true);
        assert_eq!(answer["operationKey"], KEY.1);
        assert_eq!(answer["amount"], "500.00");
        assert_eq!(
            answer["usage"]["replayedSteps"], 1,
            "the answer that asked for the charge came from the journal"
        );
        assert_eq!(h.db.receipts("BIG-1").await, 1);
        assert_eq!(
            h.model.requests(),
            2,
            "one more request: the closing sentence"
        );

        // Everyone who asks again gets the one answer, and nothing runs again.
        let repeat = decide(&h.base, &id, "approve", None).await;
        assert_eq!((repeat.status, &repeat.body), (200, &approved.body));
        let client_retry = h
            .post("/checkout?orderId=BIG-1&amount=500.00", &[KEY], None)
            .await;
        assert_eq!(
            (client_retry.status, &client_retry.body),
            (200, &approved.body)
        );
        let operation = h.get(&format!("/operations/{}", KEY.1)).await;
        assert_eq!((operation.status, &operation.body), (200, &approved.body));
        let approval = h.get(&format!("/approvals/{id}")).await.json();
        assert_eq!(approval["status"], "approved");
        assert_eq!(h.db.receipts("BIG-1").await, 1);
        assert_eq!(h.model.requests(), 2);

        // At the threshold, no one is asked.
        let small = h.checkout("SMALL-1", "100.00").await;
        assert_eq!(small.status, 200, "{}", small.text());
    }
);

both_backends!(
    a_checkout_without_a_key_that_must_wait_is_keyed_by_the_service,
    |backend| async move {
        let (h, _) = service(backend, "", |_| {}).await;
        let reply = h.checkout("BIG-2", "250.00").await;
        assert_eq!(reply.status, 202, "{}", reply.text());
        let body = reply.json();
        let key = body["operationKey"].as_str().unwrap().to_owned();
        let id = body["approval"]["id"].as_str().unwrap().to_owned();
        assert_eq!(h.get(&format!("/operations/{key}")).await.status, 202);

        let approved = decide(&h.base, &id, "approve", None).await;
        assert_eq!(approved.status, 200, "{}", approved.text());
        assert_eq!(approved.json()["operationKey"], key.as_str());
        assert_eq!(
            h.get(&format!("/operations/{key}")).await.body,
            approved.body
        );
        assert_eq!(h.db.receipts("BIG-2").await, 1);
    }
);

both_backends!(
    two_deciders_approving_at_once_charge_once_and_both_get_the_answer,
    |backend| async move {
        let (h, second) = service(backend, "", |_| {}).await;
        let body = paused(&h, "BIG-3", "500.00", KEY.1).await;
        let id = body["approval"]["id"].as_str().unwrap().to_owned();
        let there = other(&h, &second);
        let (a, b) = tokio::join!(
            decide(&h.base, &id, "approve", None),
            decide(&there, &id, "approve", None)
        );
        assert_eq!(
            (a.status, b.status),
            (200, 200),
            "{} / {}",
            a.text(),
            b.text()
        );
        assert_eq!(a.json()["receipt"], b.json()["receipt"]);
        assert_eq!(h.db.receipts("BIG-3").await, 1);
        assert_eq!(h.model.requests(), 2, "the loop resumed once");
    }
);

// Seen failing (SQLite: approved and denied both answered) with the approval's
// `status = 'pending'` and expiry conditions taken out of its UPDATE.
both_backends!(
    approve_and_deny_at_once_one_decision_wins_and_the_order_follows_it,
    |backend| async move {
        let (h, second) = service(backend, "", |_| {}).await;
        for round in 0..6 {
            let order = format!("RACE-{round}");
            let key = format!("race-{round}");
            let body = paused(&h, &order, "500.00", &key).await;
            let id = body["approval"]["id"].as_str().unwrap().to_owned();
            // Alternate which instance takes which decision.
            let (approve_at, deny_at) = if round % 2 == 0 {
                (h.base.clone(), other(&h, &second))
            } else {
                (other(&h, &second), h.base.clone())
            };
            let (approved, denied) = tokio::join!(
                decide(&approve_at, &id, "approve", None),
                decide(&deny_at, &id, "deny", Some(r#"{"reason":"race"}"#))
            );
            let operation = settled(async || {
                h.post(
                    &format!("/checkout?orderId={order}&amount=500.00"),
                    &[("idempotency-key", &key)],
                    None,
                )
                .await
            })
            .await;
            match (approved.status, denied.status) {
                (200, 409) => {
                    assert_eq!(denied.problem(409)["code"], "approval_decided");
                    assert_eq!(h.db.receipts(&order).await, 1);
                    assert_eq!(operation.status, 200);
                }
                (409, 200) => {
                    assert_eq!(approved.problem(409)["code"], "approval_decided");
                    assert_eq!(denied.json()["status"], "denied");
                    assert_eq!(h.db.receipts(&order).await, 0);
                    assert_eq!(operation.problem(403)["code"], "approval_denied");
                }
                other => panic!(
                    "one decision must win: {other:?} {} / {}",
                    approved.text(),
                    denied.text()
                ),
            }
        }
    }
);

both_backends!(
    a_denied_charge_is_never_made_and_the_operation_answers_the_denial,
    |backend| async move {
        let (h, _) = service(backend, "", |_| {}).await;
        let body = paused(&h, "BIG-4", "500.00", KEY.1).await;
        let id = body["approval"]["id"].as_str().unwrap().to_owned();
        let denied = decide(&h.base, &id, "deny", Some(r#"{"reason":"not this one"}"#)).await;
        assert_eq!(denied.status, 200, "{}", denied.text());
        assert_eq!(denied.json()["status"], "denied");
        assert_eq!(denied.json()["reason"], "not this one");

        let operation = h
            .post("/checkout?orderId=BIG-4&amount=500.00", &[KEY], None)
            .await;
        let problem = operation.problem(403);
        assert_eq!(problem["code"], "approval_denied");
        assert!(problem["detail"].as_str().unwrap().contains("not this one"));
        assert_eq!(
            h.get(&format!("/operations/{}", KEY.1)).await.body,
            operation.body
        );
        // The same decision again answers as the first; the other is refused.
        let again = decide(&h.base, &id, "deny", None).await;
        assert_eq!((again.status, &again.body), (200, &denied.body));
        let approve = decide(&h.base, &id, "approve", None).await;
        assert_eq!(approve.problem(409)["code"], "approval_decided");
        assert_eq!(h.db.receipts("BIG-4").await, 0);
        assert_eq!(
            h.model.requests(),
            1,
            "the model is not asked after a denial"
        );
    }
);

// Seen failing (the late approval charged) with the expiry condition taken out of the
// approval's UPDATE.
both_backends!(
    an_approval_nobody_decides_expires_and_nothing_is_charged,
    |backend| async move {
        let (h, _) = service(backend, "", |s| {
            s.payments.approval_ttl = Duration::from_secs(1);
        })
        .await;
        let body = paused(&h, "BIG-5", "500.00", KEY.1).await;
        let id = body["approval"]["id"].as_str().unwrap().to_owned();
        // A decision after the expiry is refused, whether or not the sweep came first.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let late = decide(&h.base, &id, "approve", None).await;
        assert_eq!(late.problem(410)["code"], "approval_expired");
        let operation = h
            .post("/checkout?orderId=BIG-5&amount=500.00", &[KEY], None)
            .await;
        assert_eq!(operation.problem(410)["code"], "approval_expired");
        let approval = h.get(&format!("/approvals/{id}")).await.json();
        assert_eq!(approval["status"], "expired");
        assert_eq!(h.db.receipts("BIG-5").await, 0);

        // The sweep expires one nobody asks about.
        let body = paused(&h, "BIG-6", "500.00", "other-key").await;
        let id = body["approval"]["id"].as_str().unwrap().to_owned();
        until("the sweep expires the approval", async || {
            h.get("/metrics")
                .await
                .text()
                .contains("checkout_approval_decisions_total{outcome=\"expired\"} 2")
        })
        .await;
        let operation = h.get("/operations/other-key").await;
        assert_eq!(operation.problem(410)["code"], "approval_expired");
        assert_eq!(
            h.get(&format!("/approvals/{id}")).await.json()["status"],
            "expired"
        );
        assert_eq!(h.db.receipts("BIG-6").await, 0);
    }
);

both_backends!(
    a_charge_of_another_amount_after_the_approval_is_refused,
    |backend| async move {
        // Round 2 is the first request after the approved charge: the model asks to
        // charge again, another amount.
        let (h, _) = service(backend, "wrong-amount@2x1", |_| {}).await;
        let body = paused(&h, "BIG-7", "500.00", KEY.1).await;
        let id = body["approval"]["id"].as_str().unwrap().to_owned();
        let approved = decide(&h.base, &id, "approve", None).await;
        assert_eq!(approved.status, 200, "{}", approved.text());
        assert_eq!(approved.json()["receipt"]["amount"], "500.00");
        assert_eq!(h.db.receipts("BIG-7").await, 1);
        assert_eq!(
            h.model.requests(),
            3,
            "pause, the refused call, the closing sentence"
        );
    }
);

/// Real processes on one Postgres, killed with SIGKILL.
mod crashes {
    use super::*;

    fn instance(db: &TestDb, model: &ScriptedModel, extra: &[(&str, &str)]) -> Process {
        let mut env = vec![
            ("DATABASE_URL", db.url.as_str()),
            ("CHECKOUT_IDEMPOTENCY_LEASE_MS", "1000"),
            ("CHECKOUT_REQUEST_TIMEOUT_MS", "5000"),
            ("CHECKOUT_LOOP_TIMEOUT_MS", "10000"),
            ("CHECKOUT_APPROVAL_ABOVE", "USD:100.00"),
        ];
        let base = model.base_url();
        env.push(("OPENAI_BASE_URL", &base));
        env.extend_from_slice(extra);
        Process::start(&env)
    }

    fn kill(mut victim: Process) {
        victim.signal("KILL");
        let status = victim.wait(Duration::from_secs(5));
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }

    /// Paused on one instance, which then dies; approved on the other: one charge.
    /// Nothing of the paused checkout was in the dead instance's memory.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_while_paused_approved_on_another_instance_charges_once() {
        let db = TestDb::new(Backend::Postgres).await;
        let model = scripted("").await;
        let (victim, survivor) = (instance(&db, &model, &[]), instance(&db, &model, &[]));
        let http = client();
        let reply = post(
            &http,
            &victim.url("/checkout?orderId=K-1&amount=500.00"),
            &[KEY],
            None,
        )
        .await;
        assert_eq!(reply.status, 202, "{}", reply.text());
        let id = reply.json()["approval"]["id"].as_str().unwrap().to_owned();
        kill(victim);

        let approved = decide(&survivor.base, &id, "approve", None).await;
        assert_eq!(approved.status, 200, "{}", approved.text());
        assert_eq!(approved.json()["charged"], true);
        assert_eq!(db.receipts("K-1").await, 1);
        assert_eq!(model.requests(), 2);
        let retry = post(
            &http,
            &survivor.url("/checkout?orderId=K-1&amount=500.00"),
            &[KEY],
            None,
        )
        .await;
        assert_eq!(retry.body, approved.body);
    }

    /// Approved, and the approving instance dies before the charge (its resumed loop
    /// waits on the model: the journal is off here, so the resume asks again). The
    /// approval's transaction left the operation under a lease that lapses; the other
    /// instance's recovery sweep finishes it: one charge, the answer saved for the client.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_after_the_approval_before_the_charge_the_sweep_charges_once() {
        let db = TestDb::new(Backend::Postgres).await;
        // Round 1 of the resumed loop hangs for 3 s (the first round 1 answers at once).
        let model = scripted("").await;
        let off = [("CHECKOUT_JOURNAL", "false")];
        let (victim, survivor) = (instance(&db, &model, &off), instance(&db, &model, &off));
        let http = client();
        let reply = post(
            &http,
            &victim.url("/checkout?orderId=K-2&amount=500.00"),
            &[KEY],
            None,
        )
        .await;
        assert_eq!(reply.status, 202, "{}", reply.text());
        let id = reply.json()["approval"]["id"].as_str().unwrap().to_owned();
        model
            .set_faults(checkout::model::scripted::FaultRule::parse_plan("slow=3000@1x1").unwrap());
        let approving = {
            let base = victim.base.clone();
            tokio::spawn(async move { decide(&base, &id, "approve", None).await })
        };
        until("the resumed loop asks the model", async || {
            model.requests() == 2
        })
        .await;
        kill(victim);
        let _ = approving.await;
        assert_eq!(
            db.receipts("K-2").await,
            0,
            "nothing charged before the kill"
        );

        let done = settled(async || {
            post(
                &http,
                &survivor.url("/checkout?orderId=K-2&amount=500.00"),
                &[KEY],
                None,
            )
            .await
        })
        .await;
        assert_eq!(done.status, 200, "{}", done.text());
        assert_eq!(done.json()["charged"], true);
        assert_eq!(db.receipts("K-2").await, 1);
    }
}

/// With API keys: only a key with `approve` decides, a caller sees its own approvals and
/// no one else's, and a key's own threshold goes before the setting's.
mod with_keys {
    use super::*;
    use crate::auth::{Service, bearer};
    use checkout::caller::{self, AuthMode, KeySpec, Scopes};

    async fn key(s: &Service, name: &str, scopes: &str, above: Option<&str>) -> String {
        let spec = KeySpec {
            scopes: Scopes::parse(scopes).unwrap(),
            approval_above: above.map(|a| PerCurrency::parse(a).unwrap()),
            ..KeySpec::default()
        };
        bearer(
            &caller::create_with(s.state.db(), name, &spec)
                .await
                .unwrap()
                .key,
        )
    }

    async fn post_as(s: &Service, auth: &str, path: &str) -> Reply {
        post(
            &client(),
            &format!("{}{path}", s.url_base()),
            &[("authorization", auth)],
            None,
        )
        .await
    }

    // Seen failing: with `require(&caller, Scope::Approve)` taken out of approve, the
    // shop's own key approved its checkout (200 where 403) and charged it.
    both_backends!(
        only_a_key_with_approve_decides_and_a_caller_sees_only_its_own,
        |backend| async move {
            let s = Service::start_with(backend, AuthMode::Required, with_approval).await;
            let shop = key(&s, "shop", "checkout", None).await;
            let other = key(&s, "other", "checkout", None).await;
            let person = key(&s, "person", "approve", None).await;
            let reply = s
                .checkout_of("K-9", "500.00", &[("authorization", &shop)])
                .await;
            assert_eq!(reply.status, 202, "{}", reply.text());
            let id = reply.json()["approval"]["id"].as_str().unwrap().to_owned();

            let own = s
                .get(&format!("/approvals/{id}"), &[("authorization", &shop)])
                .await;
            assert_eq!(own.status, 200, "{}", own.text());
            let theirs = s
                .get(&format!("/approvals/{id}"), &[("authorization", &other)])
                .await;
            assert_eq!(theirs.problem(404)["code"], "not_found");
            let listed = s
                .get("/approvals", &[("authorization", &other)])
                .await
                .json();
            assert_eq!(listed["approvals"].as_array().unwrap().len(), 0);

            for who in [&shop, &other] {
                let refused = post_as(&s, who, &format!("/approvals/{id}/approve")).await;
                assert_eq!(refused.problem(403)["code"], "forbidden");
                let refused = post_as(&s, who, &format!("/approvals/{id}/deny")).await;
                assert_eq!(refused.problem(403)["code"], "forbidden");
            }
            assert_eq!(s.db.receipts("K-9").await, 0);

            let approved = post_as(&s, &person, &format!("/approvals/{id}/approve")).await;
            assert_eq!(approved.status, 200, "{}", approved.text());
            assert_eq!(s.db.receipts("K-9").await, 1);
            let seen = s
                .get(&format!("/approvals/{id}"), &[("authorization", &shop)])
                .await;
            assert_eq!(seen.json()["decidedBy"], "person");
            assert_eq!(seen.json()["caller"], "shop");
        }
    );

    // Seen failing: with the handler reading the setting's threshold only, the key's own
    // USD:10.00 let a 50.00 checkout through (200 where 202).
    both_backends!(
        a_keys_own_threshold_goes_before_the_setting,
        |backend| async move {
            let s = Service::start_with(backend, AuthMode::Required, with_approval).await;
            let strict = key(&s, "strict", "checkout", Some("USD:10.00")).await;
            let loose = key(&s, "loose", "checkout", Some("USD:1000.00")).await;
            let paused = s
                .checkout_of("T-1", "50.00", &[("authorization", &strict)])
                .await;
            assert_eq!(paused.status, 202, "{}", paused.text());
            let through = s
                .checkout_of("T-2", "500.00", &[("authorization", &loose)])
                .await;
            assert_eq!(through.status, 200, "{}", through.text());
            assert_eq!(
                (s.db.receipts("T-1").await, s.db.receipts("T-2").await),
                (0, 1)
            );
        }
    );
}
