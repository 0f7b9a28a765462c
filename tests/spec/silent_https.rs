//! A model connection over `https://` (HTTP/2 by ALPN, hyper-util's pooled clients) that
//! goes silent, with the default keep-alive settings: the request on it waits out its
//! timeout once, and no later checkout waits on it. The h2c wire's own is in hostile.rs.
//!
//! The service runs as a process: it trusts the test's CA through `SSL_CERT_FILE`, as
//! the platform's verifier reads it, which one process of many tests cannot set for
//! one of them. The server is the suite's own (common/hostile.rs, `Silent`, over TLS): a
//! real one cannot be made to go silent on one connection and serve the next.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::common::hostile::{H2Fault, h2_faulty, past_a_silent_connection, trusted_tls};
use crate::common::{Backend, Process, TestDb, client, post, sample, scripted};

// Seen failing without the pooled client's retirement (src/model/transport/mod.rs):
// "checkout SILENT-2 took 1.2s, waiting on the silent connection" (1.3s on Postgres).
both_backends!(
    a_silent_https_connection_costs_one_timeout_with_the_default_keep_alive,
    |backend| async move {
        let db = TestDb::new(backend).await;
        let model = scripted("").await;
        let (_dir, ca, tls) = trusted_tls();
        let (addr, requests, connections) = h2_faulty(&model, H2Fault::Silent, Some(tls)).await;
        let base = format!("https://{addr}/v1");
        let ca = ca.display().to_string();
        // The keep-alive settings left at their defaults (a PING every 10 s, 5 s for its
        // answer); a request timeout of 1 s.
        let timeout = Duration::from_millis(1_000);
        let process = Process::start(&[
            ("DATABASE_URL", db.url.as_str()),
            ("OPENAI_BASE_URL", &base),
            ("SSL_CERT_FILE", &ca),
            ("CHECKOUT_REQUEST_TIMEOUT_MS", "1000"),
            ("CHECKOUT_LOOP_TIMEOUT_MS", "5000"),
        ]);
        let http = client();
        let took = past_a_silent_connection(
            async |order: &str| {
                let url = process.url(&format!("/checkout?orderId={order}&amount=10.00"));
                post(&http, &url, &[], None).await
            },
            timeout,
        )
        .await;
        // The counts below hold while the silent connection is still open: its PING has
        // 5 s after the 10 s keep-alive interval.
        assert!(took < Duration::from_secs(10), "{took:?}");
        assert_eq!(db.all_receipts().await, 9);
        let seen = |n: &AtomicU64| n.load(Ordering::SeqCst);
        assert_eq!(model.requests(), 18, "two turns each, all relayed");
        assert_eq!(
            seen(&requests),
            19,
            "the silent connection took one request, the first"
        );
        assert_eq!(
            seen(&connections),
            5,
            "the silent one, one for each of the four pooled clients after it"
        );
        let metrics = http.get(process.url("/metrics")).send().await.unwrap();
        let metrics = metrics.text().await.unwrap();
        assert_eq!(
            sample(&metrics, "checkout_timeouts_total{layer=\"request\"}"),
            Some(1.0),
            "{metrics}"
        );
    }
);
