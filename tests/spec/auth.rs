//! Callers and their API keys, through HTTP on both databases: who is refused (401
//! `unauthorized`, nothing charged), who is let in, how `CHECKOUT_AUTH` decides, and that
//! Idempotency-Keys are scoped per caller. Keys are made and revoked with the same library
//! calls `checkout api-keys` makes, on the service's own database, while it serves.

use std::time::Duration;

use crate::common::{Backend, Process, Reply, TestDb};
use checkout::App;
use checkout::caller::{self, AuthMode};
use checkout::db::{Database, PoolSettings};
use checkout::http::AppState;
use tokio::sync::oneshot;

/// The service in this process with `auth`, and a handle on its database.
pub(crate) struct Service {
    pub(crate) db: TestDb,
    pub(crate) model: checkout::model::scripted::ScriptedModel,
    pub(crate) state: AppState,
    base: String,
    http: reqwest::Client,
    _stop: oneshot::Sender<()>,
}

impl Service {
    pub(crate) async fn start(backend: Backend, auth: AuthMode) -> Service {
        Service::start_with(backend, auth, |_| {}).await
    }

    /// As [`Service::start`], with the settings adjusted by `tune`, on a database of its
    /// own.
    pub(crate) async fn start_with(
        backend: Backend,
        auth: AuthMode,
        tune: impl FnOnce(&mut checkout::config::Settings),
    ) -> Service {
        Service::on(TestDb::new(backend).await, auth, tune).await
    }

    /// As [`Service::start_with`], on `db` (prepared by the test).
    pub(crate) async fn on(
        db: TestDb,
        auth: AuthMode,
        tune: impl FnOnce(&mut checkout::config::Settings),
    ) -> Service {
        let model = crate::common::scripted("").await;
        let mut settings = crate::common::test_settings(&db, &model);
        settings.server.auth = auth;
        tune(&mut settings);
        let listener = tokio::net::TcpListener::bind(settings.server.listen)
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = App::build(settings).await.expect("the service starts");
        let state = app.state().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(app.serve(listener, async {
            let _ = stopped.await;
        }));
        Service {
            db,
            model,
            state,
            base,
            http: crate::common::client(),
            _stop: stop,
        }
    }

    /// A new key named `name`, as `checkout api-keys create NAME` makes it.
    pub(crate) async fn create_key(&self, name: &str) -> String {
        caller::create(self.state.db(), name).await.unwrap().key
    }

    async fn revoke_key(&self, name: &str) {
        caller::revoke(self.state.db(), name).await.unwrap()
    }

    pub(crate) async fn checkout(&self, order: &str, headers: &[(&str, &str)]) -> Reply {
        self.checkout_of(order, "42.50", headers).await
    }

    pub(crate) async fn checkout_of(
        &self,
        order: &str,
        amount: &str,
        headers: &[(&str, &str)],
    ) -> Reply {
        let url = format!("{}/checkout?orderId={order}&amount={amount}", self.base);
        crate::common::post(&self.http, &url, headers, None).await
    }

    /// The service's base URL (`http://127.0.0.1:PORT`).
    pub(crate) fn url_base(&self) -> &str {
        &self.base
    }

    pub(crate) async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut request = self.http.get(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Reply::read(request.send().await.expect("GET")).await
    }
}

/// Waits until a request without a key is refused (a read, so that the requests sent
/// while the service is still open charge nothing); how long that took.
async fn until_keys_are_required(s: &Service) -> Duration {
    let start = std::time::Instant::now();
    loop {
        let reply = s.get("/receipts/NONE", &[]).await;
        if reply.status == 401 {
            return start.elapsed();
        }
        assert_eq!(reply.status, 404, "{}", reply.text());
        assert!(
            start.elapsed() < caller::KEYS_REFRESH * 3,
            "still open {:?} after the first key",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// A 401 `unauthorized` problem with this challenge.
fn assert_unauthorized(reply: &Reply, challenge: &str) {
    let problem = reply.problem(401);
    assert_eq!(problem["code"], "unauthorized", "{}", reply.text());
    assert_eq!(problem["status"], 401);
    assert_eq!(reply.header("www-authenticate"), Some(challenge));
}

both_backends!(
    without_a_key_checkout_is_401_and_charges_nothing,
    |backend| async move {
        let s = Service::start(backend, AuthMode::Auto).await;
        s.create_key("shop").await;
        until_keys_are_required(&s).await;
        // Counted by reason, the key-less requests as `missing`; /metrics is open.
        let missing = async || {
            let scrape = s.get("/metrics", &[]).await.text();
            scrape
                .lines()
                .find_map(|line| {
                    line.strip_prefix("checkout_auth_failures_total{reason=\"missing\"} ")?
                        .parse::<u64>()
                        .ok()
                })
                .unwrap_or_else(|| panic!("no missing series in {scrape}"))
        };
        let before = missing().await;
        let reply = s.checkout("A-1", &[]).await;
        assert_unauthorized(&reply, "Bearer");
        let reply = s.get("/receipts/A-1", &[]).await;
        assert_unauthorized(&reply, "Bearer");
        assert_eq!(missing().await, before + 2);
        assert_eq!(s.db.all_receipts().await, 0);
        assert_eq!(
            s.db.count("SELECT count(*) FROM idempotency_keys", None)
                .await,
            0
        );
    }
);

both_backends!(
    a_valid_key_charges_and_once_revoked_is_401,
    |backend| async move {
        let s = Service::start(backend, AuthMode::Auto).await;
        let key = s.create_key("shop").await;
        let auth = bearer(&key);
        let reply = s.checkout("A-2", &[("authorization", &auth)]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["charged"], true);
        let receipt = s.get("/receipts/A-2", &[("authorization", &auth)]).await;
        assert_eq!(receipt.status, 200, "{}", receipt.text());
        assert_eq!(receipt.json()["orderId"], "A-2");
        assert_eq!(s.db.all_receipts().await, 1);

        s.revoke_key("shop").await;
        let reply = s.checkout("A-3", &[("authorization", &auth)]).await;
        assert_unauthorized(&reply, "Bearer error=\"invalid_token\"");
        assert_eq!(s.db.receipts("A-3").await, 0);
        assert_eq!(s.db.all_receipts().await, 1);
    }
);

both_backends!(a_wrong_key_or_another_scheme_is_401, |backend| async move {
    let s = Service::start(backend, AuthMode::Auto).await;
    let key = s.create_key("shop").await;
    // The right key with its last digit changed.
    let mut wrong = key.clone();
    let last = if wrong.ends_with('0') { "1" } else { "0" };
    wrong.replace_range(wrong.len() - 1.., last);
    let reply = s
        .checkout("A-4", &[("authorization", &bearer(&wrong))])
        .await;
    assert_unauthorized(&reply, "Bearer error=\"invalid_token\"");
    let reply = s
        .checkout("A-4", &[("authorization", "Basic c2hvcDpzZWNyZXQ=")])
        .await;
    assert_unauthorized(&reply, "Bearer");
    let reply = s.checkout("A-4", &[("authorization", &key)]).await;
    assert_unauthorized(&reply, "Bearer");
    assert_eq!(s.db.all_receipts().await, 0);
});

both_backends!(
    the_same_idempotency_key_from_two_callers_is_two_operations,
    |backend| async move {
        let s = Service::start(backend, AuthMode::Auto).await;
        let alice = bearer(&s.create_key("alice").await);
        let bob = bearer(&s.create_key("bob").await);
        let carol = bearer(&s.create_key("carol").await);
        let key = ("idempotency-key", "\"shared-key-1\"");

        let first = s.checkout("B-1", &[("authorization", &alice), key]).await;
        assert_eq!(first.status, 200, "{}", first.text());
        assert_eq!(first.json()["charged"], true);

        // Bob's use of the key is his own operation: another order is charged, where one
        // caller reusing the key for another order meets 422 key_reuse.
        let other = s.checkout("B-2", &[("authorization", &bob), key]).await;
        assert_eq!(other.status, 200, "{}", other.text());
        assert_eq!(other.json()["charged"], true);
        let reuse = s.checkout("B-2", &[("authorization", &alice), key]).await;
        assert_eq!(reuse.problem(422)["code"], "key_reuse");

        // Carol, same key and same order as Alice's: not her saved answer replayed
        // (idempotent-replayed) but an operation of her own, which finds the order's
        // receipt. (Its `charged` is wrong today: see the ignored test below.)
        let carols = s.checkout("B-1", &[("authorization", &carol), key]).await;
        assert_eq!(carols.status, 200, "{}", carols.text());
        assert_eq!(carols.header("idempotent-replayed"), None);
        assert_eq!(
            carols.json()["receipt"]["id"],
            first.json()["receipt"]["id"]
        );
        // Alice's repeat is a replay of her own answer.
        let again = s.checkout("B-1", &[("authorization", &alice), key]).await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.body, first.body);

        assert_eq!(s.db.receipts("B-1").await, 1);
        assert_eq!(s.db.receipts("B-2").await, 1);
        assert_eq!(s.db.all_receipts().await, 2);
        assert_eq!(
            s.db.count("SELECT count(*) FROM idempotency_keys", None)
                .await,
            3
        );
    }
);

both_backends!(
    a_keyless_checkout_is_recorded_under_its_callers_name,
    |backend| async move {
        let s = Service::start(backend, AuthMode::Auto).await;
        let shop = bearer(&s.create_key("shop").await);
        let reply = s.checkout("K-1", &[("authorization", &shop)]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        // Seen failing without the caller passed on the keyless branch: the receipt was
        // recorded under the anonymous caller '' (0 rows under 'shop').
        assert_eq!(
            s.db.count(
                "SELECT count(*) FROM receipts WHERE order_id = 'K-1' AND caller = 'shop'",
                None
            )
            .await,
            1
        );
        assert_eq!(s.db.all_receipts().await, 1);
    }
);

/// `charged` says whether this operation made the charge, and an operation is its
/// caller's: another caller's operation under the same Idempotency-Key did not make
/// Alice's charge (receipts record the caller beside the operation key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_callers_operation_with_the_same_key_did_not_charge() {
    let s = Service::start(Backend::Sqlite, AuthMode::Auto).await;
    let alice = bearer(&s.create_key("alice").await);
    let carol = bearer(&s.create_key("carol").await);
    let key = ("idempotency-key", "\"shared-key-2\"");
    let first = s.checkout("G-1", &[("authorization", &alice), key]).await;
    assert_eq!(first.json()["charged"], true);
    let carols = s.checkout("G-1", &[("authorization", &carol), key]).await;
    assert_eq!(carols.status, 200, "{}", carols.text());
    assert_eq!(carols.json()["charged"], false, "{}", carols.text());
}

both_backends!(
    auto_is_open_on_loopback_until_the_first_key_and_stays_closed_after_revoking,
    |backend| async move {
        let s = Service::start(backend, AuthMode::Auto).await;
        let open = s.checkout("C-1", &[]).await;
        assert_eq!(open.status, 200, "{}", open.text());
        // A key that is sent is checked even while the service is open.
        let reply = s
            .checkout("C-9", &[("authorization", "Bearer ck_none")])
            .await;
        assert_unauthorized(&reply, "Bearer error=\"invalid_token\"");

        s.create_key("first").await;
        let took = until_keys_are_required(&s).await;
        assert!(took <= caller::KEYS_REFRESH * 2, "{took:?}");
        let reply = s.checkout("C-2", &[]).await;
        assert_unauthorized(&reply, "Bearer");
        s.revoke_key("first").await;
        let reply = s.checkout("C-2", &[]).await;
        assert_unauthorized(&reply, "Bearer");
        assert_eq!(s.db.all_receipts().await, 1);
    }
);

both_backends!(
    required_refuses_while_no_key_exists_and_off_reads_none,
    |backend| async move {
        let s = Service::start(backend, AuthMode::Required).await;
        let reply = s.checkout("D-1", &[]).await;
        assert_unauthorized(&reply, "Bearer");
        assert_eq!(s.db.all_receipts().await, 0);

        let s = Service::start(backend, AuthMode::Off).await;
        s.create_key("shop").await;
        let reply = s.checkout("D-2", &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let reply = s
            .checkout("D-3", &[("authorization", "Bearer ck_none")])
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(s.db.all_receipts().await, 2);
    }
);

both_backends!(
    health_the_api_document_and_swagger_ui_stay_open,
    |backend| async move {
        let s = Service::start(backend, AuthMode::Required).await;
        for path in [
            "/health/live",
            "/health/ready",
            "/api-docs/openapi.json",
            "/swagger-ui/",
        ] {
            let reply = s.get(path, &[]).await;
            assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        }
    }
);

/// Another instance on the same Postgres (here: another pool, as another process would
/// have) makes a key: the service needs keys within KEYS_REFRESH; the key counts, and
/// its revocation, from the very next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_made_by_another_instance_closes_the_service_within_a_refresh() {
    let s = Service::start(Backend::Postgres, AuthMode::Auto).await;
    assert_eq!(s.checkout("E-1", &[]).await.status, 200);
    let other = Database::open(
        &s.db.url,
        &PoolSettings {
            max_connections: 1,
            acquire_timeout: Duration::from_secs(5),
        },
    )
    .await
    .unwrap();
    let key = caller::create(&other, "elsewhere").await.unwrap().key;
    let took = until_keys_are_required(&s).await;
    assert!(took <= caller::KEYS_REFRESH * 2, "{took:?}");
    assert_unauthorized(&s.checkout("E-2", &[]).await, "Bearer");
    let reply = s.checkout("E-2", &[("authorization", &bearer(&key))]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    caller::revoke(&other, "elsewhere").await.unwrap();
    let reply = s.checkout("E-3", &[("authorization", &bearer(&key))]).await;
    assert_unauthorized(&reply, "Bearer error=\"invalid_token\"");
    assert_eq!(s.db.all_receipts().await, 2);
}

/// `CHECKOUT_AUTH=auto` on an address others can reach, with no key: exit status 2,
/// naming the setting, before it serves; `off` starts there, loudly.
#[test]
fn auto_on_a_non_loopback_address_without_a_key_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("c.db").display());
    let mut process = Process::spawn(&[("CHECKOUT_LISTEN", "0.0.0.0:0"), ("DATABASE_URL", &url)]);
    let status = process.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(2), "{:#?}", process.logs());
    let logs = process.logs().join("\n");
    assert!(
        logs.contains("CHECKOUT_AUTH=auto serves without API keys only on a loopback address"),
        "{logs}"
    );
    assert!(!logs.contains("listening on"), "{logs}");

    let process = Process::start(&[
        ("CHECKOUT_LISTEN", "0.0.0.0:0"),
        ("DATABASE_URL", &url),
        ("CHECKOUT_AUTH", "off"),
    ]);
    let logs = process.logs().join("\n");
    assert!(
        logs.contains("callers: CHECKOUT_AUTH=off: /checkout and /receipts are open to anyone"),
        "{logs}"
    );
}

/// At the most verbose level, no log line carries the API key a request sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_never_logged() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("c.db").display());
    let key = {
        let db = Database::open(
            &url,
            &PoolSettings {
                max_connections: 1,
                acquire_timeout: Duration::from_secs(5),
            },
        )
        .await
        .unwrap();
        let key = caller::create(&db, "shop").await.unwrap().key;
        db.close().await;
        key
    };
    let process = Process::start(&[("DATABASE_URL", &url), ("RUST_LOG", "trace")]);
    let http = crate::common::client();
    let url = process.url("/checkout?orderId=F-1&amount=1.00");
    let ok = crate::common::post(&http, &url, &[("authorization", &bearer(&key))], None).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let wrong = format!("{key}0");
    let refused =
        crate::common::post(&http, &url, &[("authorization", &bearer(&wrong))], None).await;
    assert_eq!(refused.status, 401);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let logs = process.logs();
    // The most verbose lines are there: each SQL statement, each model body.
    for verbose in [
        "db.statement=",
        "model request round=1",
        "model response round=2",
    ] {
        assert!(
            logs.iter().any(|l| l.contains(verbose)),
            "debug lines expected ({verbose}): {logs:#?}"
        );
    }
    let hex = &key[3..];
    for line in &logs {
        assert!(!line.contains(hex), "the key is in the log: {line}");
    }
    assert!(
        logs.iter()
            .any(|l| l.contains("request refused: no valid API key")),
        "{logs:#?}"
    );
}

/// The security requirements of every operation of the served document.
async fn security_of(s: &Service) -> Vec<serde_json::Value> {
    let doc = s.get("/api-docs/openapi.json", &[]).await.json();
    let mut found = Vec::new();
    for (_, item) in doc["paths"].as_object().expect("paths").iter() {
        for (_, operation) in item.as_object().expect("a path item").iter() {
            if let Some(security) = operation.get("security") {
                found.push(security.clone());
            }
        }
    }
    found
}

/// The served document says what the running service does: while it is open, the Bearer
/// key is optional (`security` lists `{}` beside the key); once a key exists (`auto`) it
/// is required, and with `required` it always is. Each operation names the scope it needs:
/// `approve` (or `checkout`, for its own) for the approvals, `approve` to decide one,
/// `checkout` for POST /checkout; `checkout` (a run) or `approve` (a resume) for POST
/// /agui; `checkout` (its own) or `read` for an operation, its events and a receipt;
/// `refund` for POST /refunds. In the document's order of paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_declares_the_key_optional_only_while_open() {
    let checkout = serde_json::json!({ "api_key": ["checkout"] });
    let read = serde_json::json!({ "api_key": ["read"] });
    let approve = serde_json::json!({ "api_key": ["approve"] });
    let refund = serde_json::json!({ "api_key": ["refund"] });
    let needs = [
        vec![&checkout, &approve],
        vec![&approve, &checkout],
        vec![&approve, &checkout],
        vec![&approve],
        vec![&approve],
        vec![&checkout],
        vec![&checkout, &read],
        vec![&checkout, &read],
        vec![&checkout, &read],
        vec![&refund],
    ];
    let open = serde_json::json!({});
    let optional: Vec<serde_json::Value> = needs
        .iter()
        .map(|n| serde_json::json!(n.iter().copied().chain([&open]).collect::<Vec<_>>()))
        .collect();
    let required: Vec<serde_json::Value> = needs.iter().map(|n| serde_json::json!(n)).collect();
    let s = Service::start(Backend::Sqlite, AuthMode::Auto).await;
    assert_eq!(security_of(&s).await, optional);
    s.create_key("shop").await;
    until_keys_are_required(&s).await;
    assert_eq!(security_of(&s).await, required);

    let off = Service::start(Backend::Sqlite, AuthMode::Off).await;
    assert_eq!(security_of(&off).await, optional);
    let keyed = Service::start(Backend::Sqlite, AuthMode::Required).await;
    assert_eq!(security_of(&keyed).await, required);
}
