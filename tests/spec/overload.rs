//! Too much work is refused cleanly and never half-done: admission (503 `overloaded`
//! before anything is written, a refused key served on retry, replays and receipts served
//! when full), the rate limit per caller (429 `rate_limited` with the IETF fields, other
//! callers unaffected), and connections that stall their request head (closed, while a
//! normal checkout is answered). The scripted model's delay holds the loops; the model
//! counts the requests it is sent.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::{
    Backend, Harness, Process, Reply, TestDb, post, sample, scripted, test_settings, until,
};
use checkout::caller::{self, AuthMode};
use checkout::db::{Database, PoolSettings};

/// Sends a POST to every path at once, each with `headers`, and waits for the answers.
async fn at_once(
    h: &Harness,
    paths: impl IntoIterator<Item = String>,
    headers: &[(&str, &str)],
) -> Vec<Reply> {
    let sends: Vec<_> = paths
        .into_iter()
        .map(|path| {
            let (http, url) = (h.http.clone(), h.url(&path));
            let headers: Vec<(String, String)> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            tokio::spawn(async move {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                post(&http, &url, &headers, None).await
            })
        })
        .collect();
    let mut replies = Vec::new();
    for send in sends {
        replies.push(send.await.expect("the send ran"));
    }
    replies
}

/// Settings whose model requests outlast the scripted model's delay.
fn holding_loops(s: &mut checkout::config::Settings, max_in_flight: usize) {
    s.overload.max_in_flight = max_in_flight;
    s.model_request.timeout = Duration::from_millis(2_000);
}

both_backends!(
    twice_the_limit_at_once_half_are_charged_and_half_refused_with_nothing_written,
    |backend| async move {
        const N: usize = 4;
        let h = Harness::with(backend, "", |s| holding_loops(s, N)).await;
        h.model.set_delay(Duration::from_millis(500));
        let replies = at_once(
            &h,
            (0..2 * N).map(|i| format!("/checkout?orderId=O-{i}&amount=10.00")),
            &[],
        )
        .await;
        let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            N,
            "{statuses:?}"
        );
        let refused: Vec<&Reply> = replies.iter().filter(|r| r.status != 200).collect();
        assert_eq!(refused.len(), N, "{statuses:?}");
        for reply in refused {
            assert_eq!(reply.problem(503)["code"], "overloaded");
            // No loop had finished yet: the floor of 1 s.
            assert_eq!(reply.header("retry-after"), Some("1"));
        }
        assert_eq!(h.db.all_receipts().await, N as i64);
        assert_eq!(
            h.model.requests(),
            2 * N as u64,
            "two rounds per admitted checkout, none for a refused one"
        );
        let text = h.get("/metrics").await.text();
        assert_eq!(
            sample(&text, "checkout_refusals_total{code=\"overloaded\"}"),
            Some(N as f64),
            "{text}"
        );
        assert_eq!(
            sample(&text, "checkout_loops_in_flight"),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, "checkout_loops_in_flight_limit"),
            Some(N as f64),
            "{text}"
        );
        assert_eq!(
            sample(&text, "checkout_checkouts_total{code=\"ok\"}"),
            Some(N as f64),
            "{text}"
        );
    }
);

both_backends!(
    when_full_a_keyed_request_is_refused_unrecorded_and_served_on_retry_while_replays_and_receipts_are_served,
    |backend| async move {
        let h = Harness::with(backend, "", |s| holding_loops(s, 1)).await;
        let key = [("idempotency-key", "k-done")];
        let done = h.post("/checkout?orderId=DONE-1&amount=5.00", &key, None).await;
        assert_eq!(done.status, 200, "{}", done.text());
        h.model.set_delay(Duration::from_millis(800));
        let holder = {
            let (http, url) = (h.http.clone(), h.url("/checkout?orderId=HOLD-1&amount=6.00"));
            tokio::spawn(async move { post(&http, &url, &[], None).await })
        };
        until("the holder's loop has asked the model", async || h.model.requests() == 3).await;

        let new_key = [("idempotency-key", "k-1")];
        let refused = h.post("/checkout?orderId=K-1&amount=7.00", &new_key, None).await;
        assert_eq!(refused.problem(503)["code"], "overloaded");
        assert!(refused.header("retry-after").is_some());
        let record = "SELECT count(*) FROM idempotency_keys WHERE key = $1";
        assert_eq!(h.db.count(record, Some("k-1")).await, 0, "no Idempotency-Key record");
        let journal = "SELECT count(*) FROM agent_journal WHERE operation_key = $1";
        assert_eq!(h.db.count(journal, Some("k-1")).await, 0, "no journal");
        assert_eq!(h.db.receipts("K-1").await, 0);

        // Full, and still served: a finished key's answer, a receipt, health.
        let replay = h.post("/checkout?orderId=DONE-1&amount=5.00", &key, None).await;
        assert_eq!(replay.status, 200);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(replay.body, done.body);
        assert_eq!(h.get("/receipts/DONE-1").await.status, 200);
        assert_eq!(h.get("/health/ready").await.status, 200);
        assert_eq!(h.model.requests(), 3, "neither the refusal nor the replay asked the model");

        assert_eq!(holder.await.unwrap().status, 200);
        let retried = h.post("/checkout?orderId=K-1&amount=7.00", &new_key, None).await;
        assert_eq!(retried.status, 200, "{}", retried.text());
        assert_eq!(h.db.receipts("K-1").await, 1);
        assert_eq!(h.model.requests(), 6);
        assert_eq!(h.db.count(record, Some("k-1")).await, 1);
        assert!(h.db.count(journal, Some("k-1")).await > 0, "the served retry journals its steps");
    }
);

both_backends!(
    the_recovery_sweep_waits_for_a_slot_and_resumes_once_one_is_free,
    |backend| async move {
        // Every model request fails: the keyed checkout is answered 502 and its lease
        // released, for the sweep to resume one lease period (1 s here) later.
        let h = Harness::with(backend, "503", |s| holding_loops(s, 1)).await;
        let key = [("idempotency-key", "k-lapsed")];
        let failed = h
            .post("/checkout?orderId=L-1&amount=2.00", &key, None)
            .await;
        assert_eq!(failed.status, 502, "{}", failed.text());
        h.model.set_faults(Vec::new());
        h.model.set_delay(Duration::from_millis(1_500));
        // The one slot, taken for two model answers: 3 s, two sweeps' worth.
        let holder = {
            let (http, url) = (
                h.http.clone(),
                h.url("/checkout?orderId=HOLD-2&amount=6.00"),
            );
            tokio::spawn(async move { post(&http, &url, &[], None).await })
        };
        let recoveries = "SELECT count(*) FROM idempotency_keys WHERE key = $1 AND recoveries > 0";
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        assert_eq!(
            h.db.count(recoveries, Some("k-lapsed")).await,
            0,
            "the sweep does not resume while the instance is full"
        );
        assert_eq!(holder.await.unwrap().status, 200);
        until("the sweep resumed the operation", async || {
            h.db.receipts("L-1").await == 1
        })
        .await;
        assert_eq!(h.db.count(recoveries, Some("k-lapsed")).await, 1);
    }
);

/// A key made in `db` as `checkout api-keys create NAME` makes it, before the service
/// opens it (SQLite's file is the service's alone once it runs).
async fn api_key(db: &TestDb, name: &str) -> String {
    let pool = PoolSettings {
        max_connections: 1,
        acquire_timeout: Duration::from_secs(5),
    };
    let database = Database::open(&db.url, &pool).await.expect("the database");
    let key = caller::create(&database, name).await.expect("a key").key;
    database.close().await;
    format!("Bearer {key}")
}

both_backends!(
    a_caller_over_its_burst_is_refused_429_with_the_ietf_fields_while_another_caller_is_served,
    |backend| async move {
        const BURST: usize = 3;
        let db = TestDb::new(backend).await;
        let (alice, bob) = (api_key(&db, "alice").await, api_key(&db, "bob").await);
        let model = scripted("").await;
        let mut settings = test_settings(&db, &model);
        settings.server.auth = AuthMode::Required;
        settings.overload.rate_per_sec = 1;
        settings.overload.rate_burst = BURST as u32;
        let h = Harness::serve(db, model, settings).await;
        let replies = at_once(
            &h,
            (0..=BURST).map(|i| format!("/checkout?orderId=R-{i}&amount=3.00")),
            &[("authorization", &alice)],
        )
        .await;
        let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            BURST,
            "{statuses:?}"
        );
        let (limited, order) = replies
            .iter()
            .zip(0..)
            .find(|(r, _)| r.status != 200)
            .expect("one over the burst");
        assert_eq!(limited.problem(429)["code"], "rate_limited");
        assert_eq!(limited.header("retry-after"), Some("1"));
        assert_eq!(
            limited.header("ratelimit-policy"),
            Some("\"checkout\";q=3;w=3")
        );
        // Nothing left; the next request in at most 1 s, the whole quota 2 s after it.
        assert_eq!(limited.header("ratelimit"), Some("\"checkout\";r=0;t=3"));
        assert_eq!(
            h.db.receipts(&format!("R-{order}")).await,
            0,
            "the refused order is not charged"
        );
        assert_eq!(h.db.all_receipts().await, BURST as i64);
        assert_eq!(h.model.requests(), 2 * BURST as u64);
        for served in replies.iter().filter(|r| r.status == 200) {
            assert_eq!(
                served.header("ratelimit-policy"),
                Some("\"checkout\";q=3;w=3")
            );
            assert!(
                served
                    .header("ratelimit")
                    .is_some_and(|v| v.starts_with("\"checkout\";r="))
            );
        }

        let other = h
            .post(
                "/checkout?orderId=B-1&amount=3.00",
                &[("authorization", &bob)],
                None,
            )
            .await;
        assert_eq!(
            other.status,
            200,
            "another caller is not counted: {}",
            other.text()
        );
        assert_eq!(other.header("ratelimit"), Some("\"checkout\";r=2;t=1"));

        tokio::time::sleep(Duration::from_secs(1)).await;
        let again = h
            .post(
                "/checkout?orderId=A-9&amount=3.00",
                &[("authorization", &alice)],
                None,
            )
            .await;
        assert_eq!(
            again.status,
            200,
            "served again after Retry-After: {}",
            again.text()
        );
        assert_eq!(h.db.all_receipts().await, BURST as i64 + 2);
        let text = h.get("/metrics").await.text();
        assert_eq!(
            sample(&text, "checkout_refusals_total{code=\"rate_limited\"}"),
            Some(1.0),
            "{text}"
        );
    }
);

/// Sends one `GET /health/live` on `stream` and reads its answer's status line; `None`
/// when the service closed the connection instead.
async fn health_on(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = b"GET /health/live HTTP/1.1\r\nHost: checkout\r\n\r\n";
    stream.write_all(get).await.ok()?;
    let mut answer = vec![0; 4096];
    let n = stream.read(&mut answer).await.ok()?;
    let text = String::from_utf8_lossy(&answer[..n]).into_owned();
    text.lines()
        .next()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
}

/// Reads until the service closes `stream` (within 10 s): true if it did.
async fn closed(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest));
    match read.await {
        Ok(Ok(_)) => true,
        Ok(Err(err)) => err.kind() == std::io::ErrorKind::ConnectionReset,
        Err(_) => false,
    }
}

both_backends!(
    a_kept_alive_connection_waits_the_idle_timeout_and_a_stalled_head_only_the_header_timeout,
    |backend| async move {
        use tokio::io::AsyncWriteExt;
        let h = Harness::with(backend, "", |s| {
            s.overload.header_timeout = Duration::from_millis(500);
            s.overload.idle_timeout = Duration::from_millis(3_000);
        })
        .await;
        let addr = h.base.trim_start_matches("http://").to_owned();
        let mut kept = tokio::net::TcpStream::connect(&addr).await.unwrap();
        assert_eq!(
            health_on(&mut kept).await.as_deref(),
            Some("HTTP/1.1 200 OK")
        );
        let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stalled
            .write_all(b"GET /health/live HTTP/1.1\r\nHost")
            .await
            .unwrap();
        assert!(
            closed(&mut stalled).await,
            "a head that stalls is closed after the header timeout"
        );
        // Idle for more than twice the header timeout by now, and still served.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            health_on(&mut kept).await.as_deref(),
            Some("HTTP/1.1 200 OK"),
            "a kept-alive connection waits the idle timeout, not the header timeout"
        );
        assert!(
            closed(&mut kept).await,
            "and is closed after the idle timeout"
        );
    }
);

/// Connections that sent half a request head, on a service started with the common
/// descriptor limit of 1024 (soft and hard, so that it cannot raise it).
fn stalled_connections_are_closed_and_a_checkout_is_answered(backend: Backend) {
    const STALLED: usize = 1_100;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let db = runtime.block_on(TestDb::new(backend));
    let service = Process::start_with(
        &[
            ("DATABASE_URL", db.url.as_str()),
            ("CHECKOUT_AUTH", "off"),
            ("CHECKOUT_HEADER_TIMEOUT_MS", "2000"),
        ],
        |command| {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    let limit = libc::rlimit {
                        rlim_cur: 1024,
                        rlim_max: 1024,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        },
    );
    let addr = service.base.trim_start_matches("http://").to_owned();
    let mut stalled: Vec<TcpStream> = (0..STALLED)
        .map(|_| {
            let mut stream =
                TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
            stream
                .write_all(b"POST /checkout HTTP/1.1\r\nHost: checkout\r\n")
                .unwrap();
            stream
        })
        .collect();
    let answer = runtime.block_on(async {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        post(
            &http,
            &service.url("/checkout?orderId=S-1&amount=1.00"),
            &[],
            None,
        )
        .await
    });
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(runtime.block_on(db.receipts("S-1")), 1);
    for stream in &mut stalled {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut rest = Vec::new();
        let read = stream.read_to_end(&mut rest);
        assert!(
            read.is_ok()
                || read
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "the service closes a stalled connection: {read:?}"
        );
    }
    let logs = service.logs();
    let line = |text: &str| logs.iter().filter(|l| l.contains(text)).count();
    assert_eq!(
        line("descriptors: soft limit 1024, the hard limit"),
        1,
        "{logs:#?}"
    );
    assert_eq!(
        line("no descriptor is free"),
        0,
        "the bound on connections keeps descriptors free: {logs:#?}"
    );
}

#[test]
fn stalled_connections_are_closed_and_a_checkout_is_answered_sqlite() {
    stalled_connections_are_closed_and_a_checkout_is_answered(Backend::Sqlite)
}

#[test]
fn stalled_connections_are_closed_and_a_checkout_is_answered_postgres() {
    stalled_connections_are_closed_and_a_checkout_is_answered(Backend::Postgres)
}
