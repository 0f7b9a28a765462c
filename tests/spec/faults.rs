//! The fault matrix: every fault the scripted model can inject, at round 1 (before the
//! charge), round 2 (after it) and round 3 (the last), in three columns: the loop retry
//! resuming from the journal (the default), the loop retry restarting the loop (journal
//! off), and no loop retry; against SQLite and Postgres. Each cell states the status and
//! code, the receipts, the model requests and the journal steps replayed it expects.
//!
//! The script for the matrix has three rounds: the model charges (round 1), charges
//! again to be sure (round 2, `recharge@2`: the charge key turns it into a read), then
//! confirms (round 3). Request retries: 2; loop retries: 2 (on) or 0 (off). A round
//! before the failing one is two journal steps (the answer and the charge's result):
//! resumed, it is replayed, not asked again.

use std::time::Duration;

use crate::common::stripe::StripeFake;
use crate::common::{Backend, Harness, TestDb, through_stripe};
use checkout::config::Settings;

/// What one cell must show, named: `Expect::ok().requests(6).attempts(2)`,
/// `Expect::fail(502, "model_error").receipts(0).requests(3)`.
#[derive(Clone, Copy, Debug)]
struct Expect {
    status: u16,
    /// The problem `code`; empty for a 200.
    code: &'static str,
    receipts: i64,
    requests: u64,
    /// Loop attempts (`attempts` in the answer).
    attempts: u64,
    /// Steps taken from the journal (`usage.replayedSteps` of a 200).
    replayed: u64,
    /// A 200 whose sentence the service wrote: the order is paid and the model failed.
    service: bool,
}

impl Expect {
    /// A 200 with the order's one receipt, after one round per script step, first try.
    const fn ok() -> Expect {
        Expect {
            status: 200,
            code: "",
            receipts: 1,
            requests: 3,
            attempts: 1,
            replayed: 0,
            service: false,
        }
    }

    /// A paid order whose model failed after the charge: 200 with the receipt and the
    /// service's sentence (`messageSource: service`), never an error.
    const fn paid() -> Expect {
        Expect {
            service: true,
            ..Expect::ok()
        }
    }

    /// A problem with this status and code; no receipt unless said.
    const fn fail(status: u16, code: &'static str) -> Expect {
        Expect {
            status,
            code,
            receipts: 0,
            requests: 1,
            attempts: 1,
            replayed: 0,
            service: false,
        }
    }

    const fn receipts(self, receipts: i64) -> Expect {
        Expect { receipts, ..self }
    }

    /// Chat-completions requests the scripted model received.
    const fn requests(self, requests: u64) -> Expect {
        Expect { requests, ..self }
    }

    const fn attempts(self, attempts: u64) -> Expect {
        Expect { attempts, ..self }
    }

    const fn replayed(self, replayed: u64) -> Expect {
        Expect { replayed, ..self }
    }
}

/// The columns: how a failed loop attempt is followed up.
#[derive(Clone, Copy, Debug)]
enum Column {
    /// The loop retry, resuming from the journal (the default); the checkout sent with an
    /// Idempotency-Key, so its journal is in the database.
    Resume,
    /// The loop retry, starting over (`CHECKOUT_JOURNAL=false`).
    Restart,
    /// No loop retry.
    NoRetry,
}

const COLUMNS: [Column; 3] = [Column::Resume, Column::Restart, Column::NoRetry];

fn matrix_settings(s: &mut Settings, column: Column) {
    // Long beside an answer (milliseconds), so a loaded machine does not add a timeout
    // the cell does not expect; the loop timeout outlasts three timed-out requests.
    s.model_request.timeout = Duration::from_millis(1_000);
    s.assistant.retry.timeout = Duration::from_millis(6_000);
    s.assistant.retry.max_retries = match column {
        Column::Resume | Column::Restart => 2,
        Column::NoRetry => 0,
    };
    s.assistant.journal = !matches!(column, Column::Restart);
}

/// Runs `fault` at rounds 1, 2, 3, in each column, on `backend`, all cells at once: with
/// the ledger, then through the payment provider (the Stripe-compatible fake), where each
/// cell also counts one provider execution and one provider key per receipt.
/// `cells[round - 1] = [resume, restart, no retry]`.
async fn row(backend: Backend, fault: &str, cells: [[Expect; 3]; 3]) {
    row_with(backend, fault, cells, false).await;
    row_with(backend, fault, cells, true).await;
}

async fn row_with(backend: Backend, fault: &str, cells: [[Expect; 3]; 3], provider: bool) {
    let mut runs = tokio::task::JoinSet::new();
    for (round, columns) in (1..=3).zip(cells) {
        for (column, expect) in COLUMNS.into_iter().zip(columns) {
            let plan = if fault.contains('@') || fault == "recharge" {
                fault.to_owned()
            } else {
                let (fault, times) = fault.split_once('x').map_or((fault, ""), |(f, t)| (f, t));
                let times = if times.is_empty() {
                    String::new()
                } else {
                    format!("x{times}")
                };
                format!("{fault}@{round}{times},recharge@2")
            };
            runs.spawn(async move {
                let fake = match provider {
                    true => Some(StripeFake::start().await),
                    false => None,
                };
                let h = Harness::with(backend, &plan, |s| {
                    matrix_settings(s, column);
                    if let Some(fake) = &fake {
                        through_stripe(s, &fake.base_url());
                    }
                })
                .await;
                let path = match provider {
                    true => "/checkout?orderId=X-1&amount=42.50&paymentMethod=pm_card_visa",
                    false => "/checkout?orderId=X-1&amount=42.50",
                };
                let reply = match column {
                    // With an Idempotency-Key, so that its steps are journaled in the
                    // database (without one they are kept in process, for the loop retry:
                    // the article's incident below).
                    Column::Resume => {
                        let key = [("idempotency-key", "matrix")];
                        h.post(path, &key, None).await
                    }
                    Column::Restart | Column::NoRetry => h.post(path, &[], None).await,
                };
                let cell = format!("{plan} {column:?}{}", if provider { " stripe" } else { "" });
                assert_eq!(reply.status, expect.status, "{cell}: {}", reply.text());
                let body = reply.json();
                if expect.status == 200 {
                    assert_eq!(body["receipt"]["orderId"], "X-1", "{cell}");
                    assert_eq!(
                        body["charged"], true,
                        "{cell}: this operation made the charge"
                    );
                    let source = if expect.service { "service" } else { "model" };
                    assert_eq!(body["messageSource"], source, "{cell}: {body}");
                    let usage = &body["usage"];
                    assert_eq!(usage["replayedSteps"], expect.replayed, "{cell}: {body}");
                    assert_eq!(usage["modelRequests"], expect.requests, "{cell}: {body}");
                } else {
                    assert_eq!(body["code"], expect.code, "{cell}: {body}");
                    assert_eq!(body["orderCharged"], expect.receipts == 1, "{cell}: {body}");
                }
                assert_eq!(body["attempts"], expect.attempts, "{cell}: {body}");
                assert_eq!(h.db.receipts("X-1").await, expect.receipts, "{cell}");
                assert_eq!(h.db.all_receipts().await, expect.receipts, "{cell}");
                assert_eq!(h.model.requests(), expect.requests, "{cell}: {body}");
                if let Some(fake) = &fake {
                    let executed = i64::try_from(fake.executions()).unwrap();
                    assert_eq!(executed, expect.receipts, "{cell}: provider executions");
                    assert_eq!(fake.keys().len() as i64, expect.receipts, "{cell}: keys");
                }
            });
        }
    }
    while let Some(run) = runs.join_next().await {
        run.unwrap();
    }
}

/// A transient failure three times in a row spends the request retry (1 + 2 retries).
/// With the loop retry, the second loop attempt succeeds: resuming, it asks only the
/// failed round and those after it (6 requests whatever the round); restarting, it asks
/// every round again and finds the earlier charge, not repeating it. Without it, the
/// checkout fails after the round's three requests, unless the order is charged by then:
/// a paid order is never an error (the service writes the sentence).
fn spends_the_request_retry(status: u16, code: &'static str) -> [[Expect; 3]; 3] {
    let fail = Expect::fail(status, code);
    let resumed = Expect::ok().requests(6).attempts(2);
    [
        [
            resumed,
            Expect::ok().requests(6).attempts(2),
            fail.receipts(0).requests(3),
        ],
        [
            resumed.replayed(2),
            Expect::ok().requests(7).attempts(2),
            Expect::paid().requests(4),
        ],
        [
            resumed.replayed(4),
            Expect::ok().requests(8).attempts(2),
            Expect::paid().requests(5),
        ],
    ]
}

macro_rules! matrix_row {
    ($name:ident, $fault:expr, $cells:expr) => {
        both_backends!($name, |backend| async move {
            row(backend, $fault, $cells).await
        });
    };
}

matrix_row!(
    status_503,
    "503x3",
    spends_the_request_retry(502, "model_error")
);
matrix_row!(
    status_503_with_retry_after,
    "503+retry-after=0x3",
    spends_the_request_retry(502, "model_error")
);
matrix_row!(
    status_429,
    "429x3",
    spends_the_request_retry(502, "model_error")
);
matrix_row!(
    request_timeout,
    "timeoutx3",
    spends_the_request_retry(504, "deadline_exceeded")
);
// A connection closed unanswered: the request goes once more at once on a new connection
// (the keep-alive race's remedy, on any connection), and only that one's outcome counts.
// Three closes: the first request and its resend, then the retry's request; its resend
// is answered. Four requests for the round, one loop attempt, whatever the round.
matrix_row!(
    connection_closed,
    "closex3",
    [[Expect::ok().requests(6); 3]; 3]
);

const MODEL_ERROR: Expect = Expect::fail(502, "model_error");

// An answer that is not a chat completion is repeated by neither retry (the endpoint
// would send it again): one request; after the charge, the paid order is confirmed by
// the service.
matrix_row!(
    malformed_json,
    "malformedx1",
    [refused(1), refused(2), refused(3)]
);

// A refusal by the provider is repeated by neither retry: one request, whatever the round;
// after the charge, the paid order is confirmed by the service (docs/outage.md). (A
// transient failure without the loop retry, above, stays an error: the client's retry
// with the key is the retry, and resumes.)
const fn refused(round: u64) -> [Expect; 3] {
    let cell = if round == 1 {
        MODEL_ERROR.receipts(0)
    } else {
        Expect::paid()
    };
    [cell.requests(round); 3]
}
matrix_row!(status_401, "401", [refused(1), refused(2), refused(3)]);
matrix_row!(
    status_429_insufficient_quota,
    "429+quota",
    [refused(1), refused(2), refused(3)]
);

// Slow, but within the request timeout: nothing is retried.
matrix_row!(slow_answer, "slow=100x1", [[Expect::ok(); 3]; 3]);

// The model's mistakes are answered with an error result and cost it one more round;
// at round 3 the model has to answer once more (round 4) after the refusal.
const MISTAKE: [[Expect; 3]; 3] = [
    [Expect::ok(); 3],
    [Expect::ok(); 3],
    [Expect::ok().requests(4); 3],
];
matrix_row!(wrong_order, "wrong-orderx1", MISTAKE);
matrix_row!(wrong_amount, "wrong-amountx1", MISTAKE);
matrix_row!(same_charge_twice_in_one_answer, "double-chargex1", MISTAKE);

// A model that never stops calling the tool: every round, so the round does not vary.
// Ten rounds (CHECKOUT_MAX_ROUNDS), ten charge calls, one receipt, no loop retry, and
// the paid order confirmed by the service.
const NEVER_STOPS: [Expect; 3] = [Expect::paid().requests(10); 3];
matrix_row!(
    never_stops_calling_the_tool,
    "recharge",
    [NEVER_STOPS, NEVER_STOPS, NEVER_STOPS]
);

// The article's incident: the provider times out on the second round, after the charge.
// The loop retry resumes from the journal: round 1 and the charge are replayed, not asked
// or run again; round 2 is asked once more, then round 3.
both_backends!(the_articles_incident_charges_once, |backend| async move {
    let h = Harness::with(backend, "timeout@2x3", |s| {
        matrix_settings(s, Column::Resume)
    })
    .await;
    let reply = h.checkout("A-100", "42.50").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["attempts"], 2);
    assert_eq!(body["charged"], true);
    assert_eq!(h.db.receipts("A-100").await, 1);
    // Attempt 1: round 1, then round 2 three times (all timed out). Attempt 2: round 2
    // and the confirmation; round 1 is not asked again.
    assert_eq!(h.model.requests(), 5);
    assert_eq!(
        (h.model.requests_at_round(1), h.model.requests_at_round(2)),
        (1, 4)
    );
    assert_eq!(body["usage"]["replayedSteps"], 2, "{body}");
});

// The same incident without the journal: the loop retry restarts, round 1 is asked
// again, and the charge key turns its second charge into a read.
both_backends!(
    the_articles_incident_without_the_journal_restarts_and_charges_once,
    |backend| async move {
        let h = Harness::with(backend, "timeout@2x3", |s| {
            matrix_settings(s, Column::Restart)
        })
        .await;
        let reply = h.checkout("A-101", "42.50").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let body = reply.json();
        assert_eq!(
            (body["attempts"].as_u64(), body["charged"].as_bool()),
            (Some(2), Some(true))
        );
        assert_eq!(h.db.receipts("A-101").await, 1);
        assert_eq!(h.model.requests(), 6);
        assert_eq!(
            (h.model.requests_at_round(1), h.model.requests_at_round(2)),
            (2, 4)
        );
        assert_eq!(body["usage"]["replayedSteps"], 0, "{body}");
    }
);

/// The article's other run: a wrong API key. One request, not three (and not nine).
#[tokio::test]
async fn a_bad_api_key_is_one_request_and_a_502() {
    let db = TestDb::new(Backend::Sqlite).await;
    let model = checkout::model::scripted::ScriptedModel::start(
        "127.0.0.1:0".parse().unwrap(),
        checkout::model::scripted::Script {
            api_key: Some("sk-right".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut settings = crate::common::test_settings(&db, &model);
    settings.model.api_key = Some(checkout::secret::Secret::new("sk-wrong"));
    let h = Harness::serve(db, model, settings).await;
    let problem = h.checkout("K-1", "1.00").await.problem(502);
    assert_eq!(problem["code"], "model_error");
    assert_eq!(problem["upstreamStatus"], 401);
    assert_eq!(problem["layer"], "request retry");
    assert_eq!(
        (
            problem["attempts"].as_u64(),
            problem["requestAttempts"].as_u64()
        ),
        (Some(1), Some(1))
    );
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("401 invalid_api_key"),
        "{problem}"
    );
    assert_eq!(h.model.requests(), 1);
    assert_eq!(h.db.all_receipts().await, 0);
}

/// When retries are spent the answer says which layer gave up and after how many.
#[tokio::test]
async fn spent_retries_name_the_layer_and_the_counts() {
    let h = Harness::with(Backend::Sqlite, "503", |_| {}).await;
    let problem = h.checkout("L-1", "1.00").await.problem(502);
    assert_eq!(problem["layer"], "loop retry");
    assert_eq!(problem["attempts"], 3);
    assert_eq!(problem["requestAttempts"], 3);
    assert_eq!(problem["upstreamStatus"], 503);
    assert_eq!(
        problem["detail"],
        "the model provider answered 503 scripted_fault: scripted fault; the request retry gave up after 3 requests; the loop retry gave up after 3 loop attempts; the order was not charged"
    );
    assert_eq!(h.model.requests(), 9, "3 loop attempts x 3 requests");
}

#[tokio::test]
async fn retry_after_is_waited_out_before_the_retry() {
    let h = Harness::with(Backend::Sqlite, "503+retry-after=1@1x1", |_| {}).await;
    let reply = h.checkout("W-1", "1.00").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let arrivals = h.model.arrivals();
    assert_eq!(arrivals.len(), 3);
    let gap = arrivals[1] - arrivals[0];
    assert!(
        gap >= Duration::from_secs(1),
        "the retry came {gap:?} after the 503"
    );
}

#[tokio::test]
async fn a_retry_after_beyond_the_cap_ends_the_retries_and_is_passed_on() {
    let h = Harness::with(Backend::Sqlite, "429+retry-after=60@1", |s| {
        s.model_request.retry_after_max = Duration::from_secs(5);
        s.assistant.retry.max_retries = 0;
    })
    .await;
    let reply = h.checkout("W-2", "1.00").await;
    let problem = reply.problem(502);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("Retry-After asked for 60000 ms"),
        "{problem}"
    );
    assert_eq!(reply.header("retry-after"), Some("60"));
    assert_eq!(h.model.requests(), 1);
}

/// An outage: every request fails. The shared budget (20 % of requests, no floor here)
/// lets one retry through per five checkouts: 24 requests for 20 checkouts, not 60.
#[tokio::test]
async fn the_retry_budget_stops_a_storm() {
    let h = Harness::with(Backend::Sqlite, "503", |s| {
        s.model_request.budget_percent = 20;
        s.model_request.budget_min_per_sec = 0;
    })
    .await;
    for i in 0..20 {
        let problem = h.checkout(&format!("ST-{i}"), "1.00").await.problem(502);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("the retry budget is spent"),
            "{problem}"
        );
        assert_eq!(
            problem["attempts"], 1,
            "the loop retry does not feed a storm either"
        );
    }
    assert_eq!(h.model.requests(), 24);
    assert_eq!(h.db.all_receipts().await, 0);
}

/// The loop timeout cuts a slow attempt after its charge; the next attempt resumes from
/// the journal, and the order keeps its one receipt. Without a next attempt, the paid
/// order is still a 200.
#[tokio::test]
async fn a_loop_timeout_after_the_charge_resumes_the_loop_without_a_second_charge() {
    let tune = |s: &mut Settings, retries| {
        s.model_request.timeout = Duration::from_millis(500);
        s.assistant.retry.timeout = Duration::from_millis(700);
        s.assistant.retry.max_retries = retries;
    };
    let h = Harness::with(Backend::Sqlite, "slow=400@1x1,slow=400@2x1", |s| tune(s, 2)).await;
    let reply = h.checkout("LT-1", "1.00").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["attempts"], 2);
    assert_eq!(h.db.receipts("LT-1").await, 1);
    // Attempt 2 resumes after the charge: round 2 is asked again, round 1 is not.
    assert_eq!(h.model.requests(), 3);
    assert_eq!(h.model.requests_at_round(1), 1);

    // Without the loop retry the timeout is the loop's end, after the charge: the paid
    // order is confirmed by the service, never answered 504.
    let h = Harness::with(Backend::Sqlite, "slow=400@1x1,slow=400@2x1", |s| tune(s, 0)).await;
    let reply = h.checkout("LT-2", "1.00").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["messageSource"], "service");
    assert_eq!(reply.json()["attempts"], 1);
    assert_eq!(h.db.receipts("LT-2").await, 1);
    assert_eq!(h.model.requests(), 2);
}
