//! A primary fenced read-only under the pool's connections (`default_transaction_read_only`
//! on and the configuration reloaded, as an orchestrator fences a primary it demotes; the
//! sessions it already has turn read-only without being cut), its synchronous standby
//! promoted. The connections the pool holds still lead to the old server and still
//! answer reads there; once a statement is refused as read-only (SQLSTATE 25006) the pool
//! lets every one of them go, so that no request is served from the old server after it.
//! A real demotion (the old primary restarted as a standby) cuts every connection, which
//! is the lost database of `failover.rs`, not this.

use std::time::{Duration, Instant};

use crate::common::cluster::{Cluster, Replication};
use crate::common::{Process, Reply, client, post};
use crate::failover::{charge_all, read_write_url, until_charged};

/// The old primary's log lines of statements run in the database `checkout` (with
/// `log_statement = 'all'` and the database in each line's prefix), but for the walk's
/// own question: each new connection tries the hosts in order, asks the fenced primary
/// `SHOW transaction_read_only`, is told `on` and goes on to the next host.
fn statements_on(cluster: &Cluster, server: &crate::common::cluster::Server) -> usize {
    cluster
        .log(server)
        .lines()
        .filter(|l| {
            l.contains(" db=checkout ")
                && l.contains("LOG:  ")
                && !l.ends_with("LOG:  statement: SHOW transaction_read_only")
        })
        .count()
}

/// `GET /receipts/{order}` sent 16 times at once, four times over: how many were answered
/// 200 with `receipt`.
async fn read_often(process: &Process, order: &str, receipt: &str) -> usize {
    let http = client();
    let mut found = 0;
    for _ in 0..4 {
        let reads = (0..16).map(|_| {
            let (http, url) = (http.clone(), format!("{}/receipts/{order}", process.base));
            tokio::spawn(async move { Reply::read(http.get(url).send().await.expect("GET")).await })
        });
        for read in reads.collect::<Vec<_>>() {
            let reply = read.await.unwrap();
            if reply.status == 200 && reply.json()["id"] == receipt {
                found += 1;
            }
        }
    }
    found
}

/// After the first read-only refusal no statement reaches the fenced primary: the pool
/// holds 16 connections to it, one attempt of an order meets the refusal (the old
/// primary's log has it); from then on, the order sent until it is answered 200 (its
/// receipt on the new primary only), 16 more orders at once (each answered 200, its
/// receipt on the new primary and none on the old) and 64 reads of the first order's
/// receipt (16 at once, four times; each 200 with that receipt, where a read the old
/// primary served would be 404) leave no statement of the service in the old primary's
/// log.
// Seen failing with the pool's before_acquire and after_release hooks answering true (the
// connections kept after a 25006), twice: "statements on the fenced primary after the
// first attempt met its refusal: left: 34, right: 0" (then 37). Before the test held 16
// connections and read after a single attempt, it passed without them too: the group
// writer lets go of each connection a write failed on, and the order's own retries had
// drained the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_first_read_only_refusal_no_request_is_served_from_the_fenced_primary() {
    const ORDERS: usize = 16;
    let cluster = Cluster::start(Replication::Synchronous);
    let (primary, standby) = (&cluster.primary, &cluster.standby);
    let url = read_write_url(primary.port, standby.port);
    let process = Process::start(&[
        ("DATABASE_URL", url.as_str()),
        ("CHECKOUT_AUTH", "off"),
        ("CHECKOUT_IDEMPOTENCY_LEASE_MS", "2000"),
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let orders = |prefix: &str| (0..ORDERS).map(|n| format!("{prefix}-{n}")).collect();
    // Orders at once, so that the pool holds several connections to the primary.
    let before = charge_all(&process.base, orders("FENCE-BEFORE"), deadline).await;
    assert_eq!(before.len(), ORDERS);
    // Reads at once, so that the pool holds as many connections as it may: the group
    // writer lets go of each connection a write failed on, and the pool's others are
    // the ones left leading to the old server.
    assert_eq!(
        read_often(
            &process,
            "FENCE-BEFORE-0",
            &before["FENCE-BEFORE-0"].receipt
        )
        .await,
        4 * ORDERS
    );
    let held = cluster.sql(
        primary,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = 'checkout'",
    );
    assert!(
        held.parse::<u32>().unwrap() > 1,
        "the pool holds {held} connections to the primary"
    );
    eprintln!("fenced: the pool held {held} connections to the primary");

    for setting in [
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "ALTER SYSTEM SET log_statement = 'all'",
        "ALTER SYSTEM SET log_line_prefix = '%m [%p] db=%d '",
    ] {
        cluster.sql(primary, setting);
    }
    assert_eq!(cluster.sql(primary, "SELECT pg_reload_conf()"), "t");
    cluster.promote(standby);

    // One attempt: it meets the refusal (its loop retry may then finish it elsewhere).
    let http = client();
    let attempt = post(
        &http,
        &process.url("/checkout?orderId=FENCE-FIRST&amount=5.00"),
        &[("idempotency-key", "key-FENCE-FIRST")],
        None,
    )
    .await;
    eprintln!("fenced: the first attempt was answered {}", attempt.status);
    let log = cluster.log(primary);
    let refused = log
        .lines()
        .filter(|l| l.contains(" db=checkout ") && l.contains("in a read-only transaction"))
        .count();
    assert!(
        refused >= 1,
        "the first order met the fenced primary's refusal: {log}"
    );
    let statements_after_first = statements_on(&cluster, primary);

    let first = until_charged(&http, &process.base, "FENCE-FIRST", deadline).await;
    assert_eq!(
        cluster.sql_checkout(
            standby,
            "SELECT count(*) || ' ' || min(id::text) FROM receipts WHERE order_id = 'FENCE-FIRST'"
        ),
        format!("1 {}", first.receipt)
    );

    let after = charge_all(&process.base, orders("FENCE-AFTER"), deadline).await;
    assert_eq!(after.len(), ORDERS);
    assert_eq!(
        read_often(&process, "FENCE-FIRST", &first.receipt).await,
        4 * ORDERS,
        "GET /receipts/FENCE-FIRST found its receipt every time"
    );
    assert_eq!(
        statements_on(&cluster, primary) - statements_after_first,
        0,
        "statements on the fenced primary after the first attempt met its refusal"
    );
    assert_eq!(
        cluster.sql_checkout(
            standby,
            "SELECT count(*) || ' ' || count(DISTINCT order_id) FROM receipts WHERE order_id LIKE 'FENCE-AFTER-%'"
        ),
        format!("{ORDERS} {ORDERS}")
    );
    assert_eq!(
        cluster.sql_checkout(
            primary,
            "SELECT count(*) FROM receipts WHERE order_id LIKE 'FENCE-AFTER-%' OR order_id = 'FENCE-FIRST'"
        ),
        "0"
    );
}
