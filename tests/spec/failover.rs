//! The database fails over: a primary and a streaming standby of the test's own
//! (`common::cluster`), the service given both hosts as libpq takes them
//! (`DATABASE_URL=postgres://…@standby,primary/checkout?target_session_attrs=read-write`).
//! Each new connection walks the hosts in order and keeps the first that accepts writes.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::cluster::{Cluster, Replication};
use crate::common::stripe::StripeFake;
use crate::common::{Process, Reply, client, post, until};

/// The list, `first` then `second`, keeping the first read-write server.
pub(crate) fn read_write_url(first: u16, second: u16) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{first},127.0.0.1:{second}/checkout?target_session_attrs=read-write"
    )
}

// Seen failing: with the vendored connect_target reduced to `establish` (the first host
// only, as sqlx 0.9.0), `checkout api-keys create` opened the standby: "cannot apply
// migrations: while executing migrations: error returned from database: cannot execute
// CREATE TABLE in a read-only transaction".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_the_standby_first_a_read_write_url_connects_to_the_primary_and_charges() {
    let cluster = Cluster::start(Replication::Synchronous);
    let url = read_write_url(cluster.standby.port, cluster.primary.port);

    // `checkout api-keys` opens the database as the service does.
    let made = Command::new(env!("CARGO_BIN_EXE_checkout"))
        .args(["api-keys", "create", "failover-ops"])
        .env("DATABASE_URL", &url)
        .env_remove("CHECKOUT_CONFIG")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run checkout api-keys");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let key = String::from_utf8(made.stdout).unwrap().trim().to_owned();

    let process = Process::start(&[("DATABASE_URL", &url), ("CHECKOUT_AUTH", "required")]);
    let walks = format!(
        "each new database connection walks the hosts 127.0.0.1:{}, 127.0.0.1:{} (the first read-write one)",
        cluster.standby.port, cluster.primary.port
    );
    assert!(
        process.logs().iter().any(|l| l.contains(&walks)),
        "{:#?}",
        process.logs()
    );
    let reply = post(
        &client(),
        &process.url("/checkout?orderId=FO-1&amount=5.00"),
        &[("authorization", &format!("Bearer {key}"))],
        None,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let receipt_id = reply.json()["receipt"]["id"].as_str().unwrap().to_owned();

    let primary = &cluster.primary;
    let standby = &cluster.standby;
    assert_eq!(
        cluster.sql_checkout(
            primary,
            "SELECT count(*) || ' ' || min(id::text) FROM receipts WHERE order_id = 'FO-1'"
        ),
        format!("1 {receipt_id}")
    );
    assert_eq!(
        cluster.sql_checkout(
            primary,
            "SELECT count(*) FROM api_keys WHERE name = 'failover-ops'"
        ),
        "1"
    );
    // The standby is one (it could not have taken a write), and the service keeps no
    // connection to it: the walk closed the one it opened there.
    assert_eq!(cluster.sql(standby, "SELECT pg_is_in_recovery()"), "t");
    assert_eq!(
        cluster.sql(
            standby,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'checkout'"
        ),
        "0"
    );
}

/// What the clients saw of one order: its receipt, and when its 200 came.
pub(crate) struct Answered {
    pub receipt: String,
    sent: Instant,
    received: Instant,
    /// Sends before the 200.
    pub retries: usize,
}

/// Sends the order with its key until it is answered 200 (a 503, a 504, a 409 `in_flight`
/// or no answer at all is sent again after 100 ms), within `deadline`; any other answer
/// fails the test.
pub(crate) async fn until_charged(
    http: &reqwest::Client,
    base: &str,
    order: &str,
    deadline: Instant,
) -> Answered {
    // The payment method is what the provider needs; the ledger takes it too.
    let url = format!("{base}/checkout?orderId={order}&amount=5.00&paymentMethod=pm_card_visa");
    let key = format!("key-{order}");
    let mut last = String::from("no answer");
    let mut retries = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "{order} not answered 200 in time; the last answer: {last}"
        );
        let sent = Instant::now();
        let answer = http
            .post(&url)
            .header("idempotency-key", &key)
            .timeout(Duration::from_secs(60))
            .send()
            .await;
        if let Ok(response) = answer {
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            last = format!("{status} {body}");
            match status {
                200 => {
                    return Answered {
                        receipt: body["receipt"]["id"].as_str().unwrap().to_owned(),
                        sent,
                        received: Instant::now(),
                        retries,
                    };
                }
                503 | 504 => {}
                409 if body["code"] == "in_flight" => {}
                other => panic!("{order}: {other} {body}"),
            }
        }
        retries += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// 200 keyed checkouts through two checkout processes given primary,standby with
/// read-write, by 16 clients that send each order until it is answered 200; after a third
/// are answered, the primary is crashed and, a second later, the standby promoted. With
/// [`Lag::Behind`] the standby stops receiving at a third and the crash comes at two
/// thirds.
struct CrashRun {
    cluster: Arc<Cluster>,
    instances: [Process; 2],
    answered: HashMap<String, Answered>,
    promoted: Instant,
    /// Orders sent and not yet answered 200 when the primary crashed.
    in_flight_at_crash: usize,
}

const ORDERS: usize = 200;

/// Whether the standby has every commit the primary acknowledged when it crashes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lag {
    /// It streams until the crash.
    None,
    /// Its WAL receiver is stopped (SIGSTOP) at a third of the orders, so that the third
    /// after it commits on the primary alone, as behind a slow link; at the crash it is
    /// killed (SIGKILL: the standby restarts its recovery, what the receiver had read but
    /// not written is gone), and the standby is promoted once it accepts connections.
    Behind,
}

async fn crash_mid_checkouts(
    replication: Replication,
    lag: Lag,
    extra_env: &[(&str, &str)],
) -> CrashRun {
    const CLIENTS: usize = 16;
    let cluster = Arc::new(Cluster::start(replication));
    let url = read_write_url(cluster.primary.port, cluster.standby.port);
    let mut env = vec![
        ("DATABASE_URL", url.as_str()),
        ("CHECKOUT_AUTH", "off"),
        // An operation cut off by the crash holds its key until the lease lapses; its
        // client's retries wait that long (409 in_flight), not the default 10 s.
        ("CHECKOUT_IDEMPOTENCY_LEASE_MS", "2000"),
    ];
    env.extend_from_slice(extra_env);
    let instances = [Process::start(&env), Process::start(&env)];
    let bases: Vec<String> = instances.iter().map(|p| p.base.clone()).collect();

    let deadline = Instant::now() + Duration::from_secs(120);
    let http = client();
    let answered = Arc::new(Mutex::new(HashMap::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (http, bases, answered, next) =
                (http.clone(), bases.clone(), answered.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if n >= ORDERS {
                        return;
                    }
                    let order = format!("FO-{n}");
                    let a = until_charged(&http, &bases[n % 2], &order, deadline).await;
                    answered.lock().unwrap().insert(order, a);
                }
            })
        })
        .collect();

    until("a third of the orders are charged", async || {
        answered.lock().unwrap().len() >= ORDERS / 3
    })
    .await;
    let receiver = match lag {
        Lag::None => None,
        Lag::Behind => {
            let pid = cluster.sql(&cluster.standby, "SELECT pid FROM pg_stat_wal_receiver");
            signal(libc::SIGSTOP, &pid);
            until("two thirds of the orders are charged", async || {
                answered.lock().unwrap().len() >= 2 * ORDERS / 3
            })
            .await;
            Some(pid)
        }
    };
    let in_flight_at_crash =
        next.load(Ordering::SeqCst).min(ORDERS) - answered.lock().unwrap().len();
    cluster.crash(&cluster.primary);
    if let Some(pid) = receiver {
        signal(libc::SIGKILL, &pid);
        let waiting = cluster.clone();
        tokio::task::spawn_blocking(move || waiting.until_up(&waiting.standby))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let promoting = cluster.clone();
    tokio::task::spawn_blocking(move || promoting.promote(&promoting.standby))
        .await
        .unwrap();
    let promoted = Instant::now();
    for c in clients {
        c.await.unwrap();
    }

    let answered = std::mem::take(&mut *answered.lock().unwrap());
    CrashRun {
        cluster,
        instances,
        answered,
        promoted,
        in_flight_at_crash,
    }
}

/// With a synchronous standby, 200 keyed checkouts through two instances while the
/// primary crashes (`pg_ctl stop -m immediate`) and the standby is promoted: every order
/// is answered 200 to a client that sends it again with its key, each 200's receipt is on
/// the new primary and no order has two, neither instance restarts, and a request sent
/// after the promotion is answered 200 within 15 s of it.
// Seen failing with DATABASE_URL naming the old primary alone: "FO-70 not answered 200 in
// time; the last answer: 503 … cannot reach the database: pool timed out while waiting
// for an open connection; nothing was run".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_crashed_mid_checkouts_and_its_synchronous_standby_promoted_loses_and_doubles_no_charge()
 {
    let CrashRun {
        cluster,
        mut instances,
        answered,
        promoted,
        in_flight_at_crash,
    } = crash_mid_checkouts(Replication::Synchronous, Lag::None, &[]).await;
    assert_eq!(answered.len(), ORDERS, "every order answered 200");
    assert!(in_flight_at_crash > 0, "the crash met checkouts in flight");
    let first_after = answered
        .values()
        .filter(|a| a.sent >= promoted)
        .map(|a| a.received - promoted)
        .min()
        .expect("some order was sent after the promotion");
    eprintln!(
        "failover: {in_flight_at_crash} orders in flight at the crash; {} of {ORDERS} orders sent again; the first 200 of a request sent after the promotion came {first_after:?} after it",
        answered.values().filter(|a| a.retries > 0).count()
    );
    assert!(
        first_after < Duration::from_secs(15),
        "the first 200 of a request sent after the promotion came {first_after:?} after it"
    );
    // Every 200's receipt is on the new primary, once.
    let on_new_primary = cluster.sql_checkout(
        &cluster.standby,
        "SELECT string_agg(order_id || '=' || id::text, ',') FROM receipts",
    );
    let mut expected: Vec<String> = answered
        .iter()
        .map(|(order, a)| format!("{order}={}", a.receipt))
        .collect();
    expected.sort();
    let mut on_new_primary: Vec<&str> = on_new_primary.split(',').collect();
    on_new_primary.sort();
    assert_eq!(on_new_primary, expected);
    assert_eq!(
        cluster.sql_checkout(
            &cluster.standby,
            "SELECT count(*) || ' ' || count(DISTINCT order_id) FROM receipts"
        ),
        format!("{ORDERS} {ORDERS}")
    );
    for instance in &mut instances {
        assert!(
            instance.child.try_wait().unwrap().is_none(),
            "the instance kept running: {:#?}",
            instance.logs()
        );
    }
}

/// Sends `signal` to the process `pid` (a number, as Postgres reports it).
fn signal(signal: libc::c_int, pid: &str) {
    let pid: libc::pid_t = pid.parse().expect("a process id");
    // SAFETY: kill has no memory preconditions; the pid is the standby's WAL receiver.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        sent,
        0,
        "signal {signal} to {pid}: {}",
        std::io::Error::last_os_error()
    );
}

/// Sends `orders` at once, each until it is answered 200 ([`until_charged`]).
pub(crate) async fn charge_all(
    base: &str,
    orders: Vec<String>,
    deadline: Instant,
) -> HashMap<String, Answered> {
    let http = client();
    let sends = orders.into_iter().map(|order| {
        let (http, base) = (http.clone(), base.to_owned());
        tokio::spawn(async move {
            let answered = until_charged(&http, &base, &order, deadline).await;
            (order, answered)
        })
    });
    let mut answered = HashMap::new();
    for send in sends.collect::<Vec<_>>() {
        let (order, a) = send.await.unwrap();
        answered.insert(order, a);
    }
    answered
}

/// The primary turns read-only under the service's connections (`default_transaction_
/// read_only` on, as an orchestrator fences a primary it demotes) and the standby is
/// promoted. A statement the old primary refuses as read-only (SQLSTATE 25006) is a lost
/// database (503 `unavailable`, the key usable again); connections that failed are let
/// go and new ones walk the hosts to the new primary. Every order sent after the switch is
/// answered 200 to a client that sends it again with its key, its receipt is on the new
/// primary and nothing of it on the old one, every receipt is then read back from the new
/// primary, and the service is not restarted.
// Seen failing with DATABASE_URL naming the old primary alone: "RO-AFTER-0 not answered
// 200 in time; the last answer: 503 … cannot read the Idempotency-Key record: database
// unavailable: error returned from database: cannot execute SELECT in a read-only
// transaction".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_read_only_and_its_standby_promoted_are_followed_without_a_restart() {
    const ORDERS: usize = 16;
    let cluster = Cluster::start(Replication::Synchronous);
    let url = read_write_url(cluster.primary.port, cluster.standby.port);
    let mut process = Process::start(&[
        ("DATABASE_URL", url.as_str()),
        ("CHECKOUT_AUTH", "off"),
        ("CHECKOUT_IDEMPOTENCY_LEASE_MS", "2000"),
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let orders = |prefix: &str| (0..ORDERS).map(|n| format!("{prefix}-{n}")).collect();
    // Orders at once, so that the pool keeps several connections to the primary.
    let before = charge_all(&process.base, orders("RO-BEFORE"), deadline).await;
    assert_eq!(before.len(), ORDERS);

    cluster.sql(
        &cluster.primary,
        "ALTER SYSTEM SET default_transaction_read_only = on",
    );
    assert_eq!(
        cluster.sql(&cluster.primary, "SELECT pg_reload_conf()"),
        "t"
    );
    cluster.promote(&cluster.standby);

    let after = charge_all(&process.base, orders("RO-AFTER"), deadline).await;
    assert_eq!(after.len(), ORDERS);
    eprintln!(
        "read-only switch: {} of {ORDERS} orders sent again",
        after.values().filter(|a| a.retries > 0).count()
    );
    let on_new_primary = cluster.sql_checkout(
        &cluster.standby,
        "SELECT string_agg(order_id || '=' || id::text, ',') FROM receipts WHERE order_id LIKE 'RO-AFTER-%'",
    );
    let mut on_new_primary: Vec<&str> = on_new_primary.split(',').collect();
    on_new_primary.sort();
    let mut expected: Vec<String> = after
        .iter()
        .map(|(order, a)| format!("{order}={}", a.receipt))
        .collect();
    expected.sort();
    assert_eq!(on_new_primary, expected);
    assert_eq!(
        cluster.sql_checkout(
            &cluster.primary,
            "SELECT count(*) FROM receipts WHERE order_id LIKE 'RO-AFTER-%'"
        ),
        "0"
    );
    // Reads come from the new primary too: no connection to the old one is kept.
    let http = client();
    let mut found = 0;
    for _ in 0..4 {
        for (order, a) in &after {
            let reply = Reply::read(
                http.get(format!("{}/receipts/{order}", process.base))
                    .send()
                    .await
                    .expect("GET"),
            )
            .await;
            if reply.status == 200 && reply.json()["id"] == a.receipt.as_str() {
                found += 1;
            }
        }
    }
    assert_eq!(
        found,
        4 * ORDERS,
        "GET /receipts found each receipt every time"
    );
    assert!(
        process.child.try_wait().unwrap().is_none(),
        "the service kept running: {:#?}",
        process.logs()
    );
}

/// The same crash with an asynchronous standby that has fallen behind (its WAL receiver
/// stopped for the middle third of the orders), the charges made at a payment provider
/// (the suite's Stripe fake: localstripe keeps no Idempotency-Key, and the provider's key
/// is what this shows). Commits the primary acknowledged after the standby stopped are not
/// on the promoted server: the spec requires that some were lost and counts them. What
/// must hold even then: every order is answered 200, no order has two receipts on the new
/// primary, and each order lost and sent again with its Idempotency-Key is not charged a
/// second time: the provider executed exactly one charge per order, the 200 orders' 200
/// charges. The figures go to the test's output; docs/operations.md quotes them with this
/// command.
// Seen failing with `Intent::provider_key` made unique per call (the time appended), as a
// key that did not survive the failover would be: "the provider executed one charge per
// order: left: (263, 263), right: (200, 200)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_standby_behind_at_the_crash_loses_acknowledged_receipts_and_the_provider_key_charges_once()
 {
    let provider = StripeFake::start().await;
    let base_url = provider.base_url();
    let CrashRun {
        cluster,
        instances,
        answered,
        ..
    } = crash_mid_checkouts(
        Replication::Asynchronous,
        Lag::Behind,
        &[
            ("CHECKOUT_PAYMENT_PROVIDER", "stripe"),
            ("STRIPE_BASE_URL", &base_url),
            ("STRIPE_API_KEY", "sk_test_fake"),
        ],
    )
    .await;
    assert_eq!(answered.len(), ORDERS, "every order answered 200");
    let rows = cluster.sql_checkout(
        &cluster.standby,
        "SELECT string_agg(order_id || '=' || id::text, ',') FROM receipts",
    );
    let on_new_primary: HashMap<&str, &str> = rows
        .split(',')
        .filter(|r| !r.is_empty())
        .map(|r| r.split_once('=').unwrap())
        .collect();
    let lost: Vec<&String> = answered
        .iter()
        .filter(|(order, a)| on_new_primary.get(order.as_str()) != Some(&a.receipt.as_str()))
        .map(|(order, _)| order)
        .collect();
    let absent = lost
        .iter()
        .filter(|order| !on_new_primary.contains_key(order.as_str()))
        .count();
    assert!(
        !lost.is_empty(),
        "the standby was behind at the crash: some acknowledged receipt is not on the new primary"
    );
    let executed_before = provider.executions();
    let http = client();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut new_receipt = 0;
    for order in &lost {
        let n: usize = order.trim_start_matches("FO-").parse().unwrap();
        let again = until_charged(&http, &instances[n % 2].base, order, deadline).await;
        if again.receipt != answered[*order].receipt {
            new_receipt += 1;
        }
    }
    eprintln!(
        "asynchronous failover, standby behind: {} of {ORDERS} receipts answered 200 not on the new primary ({absent} with no receipt at all); \
         sent again with their keys: {new_receipt} answered under a new receipt id; provider charges executed: {executed_before} before, {} after, for {ORDERS} orders",
        lost.len(),
        provider.executions()
    );
    assert_eq!(
        cluster.sql_checkout(
            &cluster.standby,
            "SELECT count(*) || ' ' || count(DISTINCT order_id) FROM receipts"
        ),
        format!("{ORDERS} {ORDERS}"),
        "one receipt per order on the new primary"
    );
    assert_eq!(
        (provider.executions(), provider.keys().len()),
        (ORDERS as u64, ORDERS),
        "the provider executed one charge per order"
    );
}
