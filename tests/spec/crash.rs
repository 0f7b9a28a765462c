//! Real processes on one Postgres: a process killed (SIGKILL) at each point of a keyed
//! checkout, then the client's retry to another instance; and one key spread over two.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{Backend, Process, Reply, TestDb, client, post, scripted, until};
use checkout::model::scripted::FaultRule;

const KEY: (&str, &str) = ("idempotency-key", "crash-test-key");

struct Cluster {
    db: TestDb,
    model: checkout::model::scripted::ScriptedModel,
    http: reqwest::Client,
}

impl Cluster {
    async fn new(faults: &str) -> Cluster {
        Cluster {
            db: TestDb::new(Backend::Postgres).await,
            model: scripted(faults).await,
            http: client(),
        }
    }

    fn instance(&self) -> Process {
        Process::start(&[
            ("DATABASE_URL", self.db.url.as_str()),
            ("OPENAI_BASE_URL", &self.model.base_url()),
            ("CHECKOUT_IDEMPOTENCY_LEASE_MS", "1000"),
            ("CHECKOUT_REQUEST_TIMEOUT_MS", "5000"),
            ("CHECKOUT_LOOP_TIMEOUT_MS", "10000"),
        ])
    }

    /// The checkout, sent in the background: its answer is lost with the victim.
    fn start_checkout(&self, at: &Process) -> tokio::task::JoinHandle<Reply> {
        let (http, url) = (
            self.http.clone(),
            at.url("/checkout?orderId=K-1&amount=9.99"),
        );
        tokio::spawn(async move { post(&http, &url, &[KEY], None).await })
    }

    async fn checkout(&self, at: &Process) -> Reply {
        post(
            &self.http,
            &at.url("/checkout?orderId=K-1&amount=9.99"),
            &[KEY],
            None,
        )
        .await
    }

    /// The client's retry: the same request, the same key, until it is no longer told
    /// the key is in flight (the dead instance's lease runs out within a second).
    async fn retry_until_done(&self, at: &Process) -> Reply {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let reply = self.checkout(at).await;
            if reply.status != 409 {
                return reply;
            }
            assert_eq!(reply.json()["code"], "in_flight");
            assert!(Instant::now() < deadline, "still in flight");
            let wait: u64 = reply.header("retry-after").unwrap().parse().unwrap();
            tokio::time::sleep(Duration::from_secs(wait)).await;
        }
    }
}

/// Kills `victim` with SIGKILL while its checkout is in flight.
fn kill(mut victim: Process) {
    victim.signal("KILL");
    let status = victim.wait(Duration::from_secs(5));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_the_charge_the_retry_charges_once() {
    let c = Cluster::new("slow=3000@1x1").await;
    let (victim, survivor) = (c.instance(), c.instance());
    let lost = c.start_checkout(&victim);
    until("round 1 is asked", async || c.model.requests() == 1).await;
    kill(victim);
    let _ = lost.await;
    assert_eq!(
        c.db.receipts("K-1").await,
        0,
        "nothing was charged before the kill"
    );

    let reply = c.retry_until_done(&survivor).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["charged"], true);
    assert_eq!(body["operationKey"], "crash-test-key");
    assert_eq!(c.db.receipts("K-1").await, 1);
    assert_eq!(c.model.requests(), 1 + 2, "the survivor ran the loop once");
    assert_eq!(reply.header("idempotent-replayed"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_charge_before_the_answer_the_retry_charges_once() {
    let c = Cluster::new("slow=3000@2x1").await;
    let (victim, survivor) = (c.instance(), c.instance());
    let lost = c.start_checkout(&victim);
    until("round 2 is asked, after the charge", async || {
        c.model.requests() == 2
    })
    .await;
    assert_eq!(c.db.receipts("K-1").await, 1);
    kill(victim);
    let _ = lost.await;

    let reply = c.retry_until_done(&survivor).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(
        body["charged"], true,
        "the charge is this operation's, made by the dead instance"
    );
    assert_eq!(c.db.receipts("K-1").await, 1);
    // The survivor resumes from the journal: round 1's answer and the charge's result
    // are replayed, and only round 2 is asked again.
    assert_eq!(c.model.requests(), 2 + 1);
    assert_eq!(
        c.model.requests_at_round(1),
        1,
        "round 1 is not asked again"
    );
    assert_eq!(
        (
            body["usage"]["modelRequests"].as_u64(),
            body["usage"]["replayedSteps"].as_u64()
        ),
        (Some(1), Some(2))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_while_saving_the_answer_the_retry_gets_the_committed_answer() {
    let c = Cluster::new("slow=500@1x1").await;
    let (victim, survivor) = (c.instance(), c.instance());
    let lost = c.start_checkout(&victim);
    until("round 1 is asked", async || c.model.requests() == 1).await;

    // Hold the key's row, so that the victim's save waits on it: then kill the victim
    // in the middle of saving, and let go. A share lock: the journal's appends (which
    // share-lock the row too) go on, the save's UPDATE waits.
    let pool = sqlx::PgPool::connect(&c.db.url).await.unwrap();
    let mut hold = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idempotency_keys WHERE key = $1 FOR SHARE")
        .bind(KEY.1)
        .execute(&mut *hold)
        .await
        .unwrap();
    until("the victim is saving its answer", async || {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%UPDATE idempotency_keys SET status%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        waiting == 1
    })
    .await;
    kill(victim);
    let _ = lost.await;
    hold.rollback().await.unwrap();

    // Postgres ran the save once the row was free: the answer was committed, and the
    // retry gets it instead of a second run.
    let reply = c.retry_until_done(&survivor).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("idempotent-replayed"), Some("true"));
    assert_eq!(reply.json()["charged"], true);
    assert_eq!(c.db.receipts("K-1").await, 1);
    assert_eq!(c.model.requests(), 2, "no second run");
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_requests_with_one_key_over_two_instances_run_the_loop_once() {
    let c = Cluster::new("").await;
    c.model
        .set_faults(FaultRule::parse_plan("slow=500@1x1").unwrap());
    let instances = Arc::new([c.instance(), c.instance()]);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (instances, http) = (instances.clone(), c.http.clone());
        tasks.spawn(async move {
            let at = &instances[i % 2];
            post(
                &http,
                &at.url("/checkout?orderId=K-1&amount=9.99"),
                &[KEY],
                None,
            )
            .await
        });
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
    assert_eq!((ok.len(), busy), (1, 19));
    assert_eq!(c.model.requests(), 2, "one loop run across both instances");
    assert_eq!(c.db.receipts("K-1").await, 1);
    for at in instances.iter() {
        let replay = c.checkout(at).await;
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(
            replay.body, ok[0].body,
            "both instances replay the same bytes"
        );
    }
}

/// Two instances race to resume one operation. The first is paused (SIGSTOP) after its
/// charge, waiting on round 2; its lease lapses and the client's retry to the second
/// instance takes the key over and resumes from the journal. When the first wakes up,
/// the journal refuses its round-2 answer (its fence is no longer the key's), and it
/// stops: one receipt, one journal, the second instance's answer saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_instance_that_lost_its_lease_stops_and_the_other_resumes() {
    let c = Cluster::new("slow=2000@2x1").await;
    let (first, second) = (c.instance(), c.instance());
    let late = c.start_checkout(&first);
    until("round 2 is asked, after the charge", async || {
        c.model.requests() == 2
    })
    .await;
    first.signal("STOP");

    let reply = c.retry_until_done(&second).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["charged"], true);
    assert_eq!(body["usage"]["replayedSteps"], 2, "{body}");
    assert_eq!(c.model.requests(), 3, "round 2 asked again, round 1 not");
    assert_eq!(c.model.requests_at_round(1), 1);

    first.signal("CONT");
    let late = late.await.unwrap();
    let problem = late.problem(409);
    assert_eq!(problem["code"], "in_flight");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .starts_with("another instance took this operation over"),
        "{problem}"
    );
    assert_eq!(c.db.receipts("K-1").await, 1);
    assert_eq!(
        c.db.count("SELECT count(*) FROM agent_journal", None).await,
        3,
        "steps 1 and 2 by the first instance, step 3 by the second; none after"
    );
    let replay = c.checkout(&second).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        replay.body, reply.body,
        "the second instance's answer is the one saved"
    );
}
