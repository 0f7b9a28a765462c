//! Shared test helpers: a database of the test's own (a SQLite file, or a fresh schema in
//! the machine's Postgres), the scripted model on loopback, and the service, either
//! in-process on port 0 or as a real `checkout` process.

pub mod cluster;
pub mod hostile;
pub mod localstripe;
pub mod proxy;
pub mod receiver;
pub mod servers;
pub mod smtp;
pub mod stripe;
pub mod tinyproxy;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checkout::App;
use checkout::config::Settings;
use checkout::model::scripted::{FaultRule, Script, ScriptedModel};
use serde_json::Value;
use tokio::sync::oneshot;

/// The Postgres the machine runs; `TEST_DATABASE_URL` points elsewhere.
pub fn postgres_admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/checkout_test".into())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A database only this test uses.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    /// Where the service writes its `.eml` files (no SMTP server configured).
    pub mail_dir: tempfile::TempDir,
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        install_tls();
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("a temp dir");
                let url = format!("sqlite://{}", dir.path().join("checkout.db").display());
                TestDb {
                    backend,
                    url,
                    _dir: Some(dir),
                    mail_dir: tempfile::tempdir().expect("a temp dir"),
                }
            }
            Backend::Postgres => {
                let admin = postgres_admin_url();
                ensure_database(&admin).await;
                let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
                let pool = sqlx::PgPool::connect(&admin).await.unwrap_or_else(|e| {
                    panic!(
                        "Postgres at {admin} is required for this test and cannot be reached: {e}"
                    )
                });
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                    .execute(&pool)
                    .await
                    .expect("create the test's schema");
                pool.close().await;
                let separator = if admin.contains('?') { '&' } else { '?' };
                TestDb {
                    backend,
                    url: format!("{admin}{separator}options[search_path]={schema}"),
                    _dir: None,
                    mail_dir: tempfile::tempdir().expect("a temp dir"),
                }
            }
        }
    }

    /// The URL with its host and port replaced by `addr` (a proxy in front of Postgres).
    pub fn url_via(&self, addr: SocketAddr) -> String {
        self.url.replacen("127.0.0.1:5432", &addr.to_string(), 1)
    }

    /// Rows in `receipts` for `order_id`, read straight from the database.
    pub async fn receipts(&self, order_id: &str) -> i64 {
        self.count(
            "SELECT count(*) FROM receipts WHERE order_id = $1",
            Some(order_id),
        )
        .await
    }

    /// Rows in `receipts`.
    pub async fn all_receipts(&self) -> i64 {
        self.count("SELECT count(*) FROM receipts", None).await
    }

    /// Runs one statement that needs no parameters: a test that changes what the
    /// service wrote, as an operator or a bug might.
    pub async fn execute(&self, sql: &'static str) -> u64 {
        match self.backend {
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await.expect("connect");
                let done = sqlx::query(sql).execute(&pool).await.expect("execute");
                pool.close().await;
                done.rows_affected()
            }
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await.expect("connect");
                let done = sqlx::query(sql).execute(&pool).await.expect("execute");
                pool.close().await;
                done.rows_affected()
            }
        }
    }

    /// A `SELECT count(*)` with at most one parameter, `$1`.
    pub async fn count(&self, sql: &'static str, arg: Option<&str>) -> i64 {
        match self.backend {
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await.expect("connect");
                let mut query = sqlx::query_scalar::<_, i64>(sql);
                if let Some(arg) = arg {
                    query = query.bind(arg.to_owned());
                }
                let n = query.fetch_one(&pool).await.expect("count");
                pool.close().await;
                n
            }
            Backend::Sqlite => {
                let sql = sql.replace("$1", "?1");
                let pool = sqlx::SqlitePool::connect(&self.url).await.expect("connect");
                let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
                if let Some(arg) = arg {
                    query = query.bind(arg.to_owned());
                }
                let n = query.fetch_one(&pool).await.expect("count");
                pool.close().await;
                n
            }
        }
    }
}

async fn ensure_database(url: &str) {
    let (server, name) = url.rsplit_once('/').expect("a database name in the URL");
    let name = name.split('?').next().unwrap_or(name).to_owned();
    if sqlx::PgPool::connect(url).await.is_ok() {
        return;
    }
    let pool = sqlx::PgPool::connect(&format!("{server}/postgres"))
        .await
        .unwrap_or_else(|e| panic!("Postgres at {server} is required and cannot be reached: {e}"));
    // Two tests may race to create it; the loser's error is harmless.
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&pool)
        .await;
    pool.close().await;
}

pub fn install_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Settings for tests: short timeouts and backoffs, so a fault costs milliseconds.
pub fn test_settings(db: &TestDb, model: &ScriptedModel) -> Settings {
    let mut s = Settings::default();
    s.server.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    s.database.url = db.url.clone();
    s.mail.dir = db.mail_dir.path().to_owned();
    s.model.base_url = Some(model.base_url());
    s.model_request.timeout = Duration::from_millis(400);
    s.model_request.backoff_min = Duration::from_millis(5);
    s.model_request.backoff_max = Duration::from_millis(20);
    s.assistant.retry.timeout = Duration::from_millis(3_000);
    s.assistant.retry.backoff_min = Duration::from_millis(5);
    s.assistant.retry.backoff_max = Duration::from_millis(20);
    s.server.timeout = Duration::from_millis(20_000);
    s.idempotency.lease = Duration::from_millis(1_000);
    // The model breaker's window beyond any one test's requests: these specs count the
    // other layers' requests exactly; tests/spec/outage.rs sets its own breaker.
    s.model.breaker.window = 10_000;
    // No API keys: these tests are about checkouts, and with `auto` an open service asks
    // the database every second whether a key exists, a statement on the pool that
    // tests counting connections and statements would meet (tests/auth.rs sets its own).
    s.server.auth = checkout::caller::AuthMode::Off;
    s
}

/// Settings that take payments through the Stripe-compatible fake at `base_url`.
pub fn through_stripe(s: &mut Settings, base_url: &str) {
    s.payments.provider = checkout::config::PaymentProvider::Stripe;
    s.payments.stripe_base_url = base_url.to_owned();
    s.payments.stripe_api_key = Some(checkout::secret::Secret::new("sk_test_fake"));
    s.payments.timeout = Duration::from_millis(1_000);
}

/// The service in this process on its settings' address (port 0 in tests): a second
/// instance on a test's database (Postgres; SQLite allows one per file), or a harness's.
pub struct Instance {
    pub base: String,
    /// Dropping it drops this sender, and the service shuts down.
    _stop: oneshot::Sender<()>,
}

impl Instance {
    pub async fn start(settings: Settings) -> Instance {
        let listener = tokio::net::TcpListener::bind(settings.server.listen)
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = App::build(settings).await.expect("the service starts");
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(app.serve(listener, async {
            let _ = stopped.await;
        }));
        Instance { base, _stop: stop }
    }
}

/// The scripted model and the service, in this process, on port 0.
pub struct Harness {
    pub db: TestDb,
    pub model: ScriptedModel,
    pub base: String,
    pub http: reqwest::Client,
    /// Dropping the harness drops this sender, and the service shuts down.
    _stop: oneshot::Sender<()>,
}

impl Harness {
    pub async fn start(backend: Backend) -> Harness {
        Harness::with(backend, "", |_| {}).await
    }

    /// A harness whose scripted model follows `faults` and whose settings `tune` adjusts.
    pub async fn with(backend: Backend, faults: &str, tune: impl FnOnce(&mut Settings)) -> Harness {
        let db = TestDb::new(backend).await;
        let model = scripted(faults).await;
        let mut settings = test_settings(&db, &model);
        tune(&mut settings);
        Harness::serve(db, model, settings).await
    }

    pub async fn serve(db: TestDb, model: ScriptedModel, settings: Settings) -> Harness {
        let Instance { base, _stop } = Instance::start(settings).await;
        Harness {
            db,
            model,
            base,
            http: client(),
            _stop,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST /checkout?orderId=…&amount=…` and the answer.
    pub async fn checkout(&self, order_id: &str, amount: &str) -> Reply {
        self.post(
            &format!("/checkout?orderId={order_id}&amount={amount}"),
            &[],
            None,
        )
        .await
    }

    pub async fn post(&self, path: &str, headers: &[(&str, &str)], json: Option<&str>) -> Reply {
        post(&self.http, &self.url(path), headers, json).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        Reply::read(self.http.get(self.url(path)).send().await.expect("GET")).await
    }
}

pub fn client() -> reqwest::Client {
    install_tls();
    reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .expect("a client")
}

pub async fn post(
    http: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    json: Option<&str>,
) -> Reply {
    let mut request = http.post(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(json) = json {
        request = request
            .header("content-type", "application/json")
            .body(json.to_owned());
    }
    Reply::read(request.send().await.expect("POST")).await
}

pub async fn scripted(faults: &str) -> ScriptedModel {
    let script = Script {
        faults: FaultRule::parse_plan(faults).expect("a valid fault plan"),
        ..Script::default()
    };
    ScriptedModel::start(SocketAddr::from(([127, 0, 0, 1], 0)), script)
        .await
        .expect("the scripted model starts")
}

/// An HTTP answer, read whole.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: bytes::Bytes,
}

impl Reply {
    pub async fn read(response: reqwest::Response) -> Reply {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.expect("a body");
        Reply {
            status,
            headers,
            body,
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The problem's `code`, checking that this is a problem+json answer of `status`.
    pub fn problem(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "status; body: {}", self.text());
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "content type; body: {}",
            self.text()
        );
        self.json()
    }
}

/// A `checkout` process, for what needs a real process: restarts, signals, two instances.
pub struct Process {
    pub child: Child,
    pub base: String,
    logs: Arc<Mutex<Vec<String>>>,
    /// The `.eml` directory, unless the test names its own `CHECKOUT_MAIL_DIR`.
    _mail_dir: tempfile::TempDir,
}

impl Process {
    /// Starts the binary with these environment variables and waits until it listens.
    pub fn start(env: &[(&str, &str)]) -> Process {
        Process::start_with(env, |_| {})
    }

    /// As [`Process::start`], with the command adjusted by `tune` first.
    pub fn start_with(env: &[(&str, &str)], tune: impl FnOnce(&mut Command)) -> Process {
        let mut process = Process::spawn_with(env, tune);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(addr) = process
                .logs()
                .iter()
                .find_map(|line| line.split("listening on http://").nth(1).map(str::to_owned))
            {
                let addr: String = addr
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                    .collect();
                process.base = format!("http://{addr}");
                return process;
            }
            if let Ok(Some(status)) = process.child.try_wait() {
                panic!("checkout exited with {status}: {:#?}", process.logs());
            }
            assert!(
                Instant::now() < deadline,
                "checkout did not start: {:#?}",
                process.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the binary without waiting for it.
    pub fn spawn(env: &[(&str, &str)]) -> Process {
        Process::spawn_with(env, |_| {})
    }

    fn spawn_with(env: &[(&str, &str)], tune: impl FnOnce(&mut Command)) -> Process {
        let mail_dir = tempfile::tempdir().expect("a temp dir");
        let mut command = Command::new(env!("CARGO_BIN_EXE_checkout"));
        command
            .env("CHECKOUT_MAIL_DIR", mail_dir.path())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("DATABASE_URL")
            .env_remove("CHECKOUT_CONFIG")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("CHECKOUT_SMTP_URL")
            .env("CHECKOUT_LISTEN", "127.0.0.1:0")
            .env("CHECKOUT_LOG_FORMAT", "text")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        tune(&mut command);
        let mut child = command.spawn().expect("spawn checkout");
        let logs = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let logs = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    logs.lock().unwrap().push(line);
                }
            });
        }
        Process {
            child,
            base: String::new(),
            logs,
            _mail_dir: mail_dir,
        }
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends a signal (`TERM`, `KILL`) to the process.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit, up to `limit`.
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "checkout did not exit: {:#?}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of one series of a `/metrics` scrape (`name{labels}` exactly as exposed),
/// or `None` when absent.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        Some(value.parse().expect("a sample value"))
    })
}

/// Waits until `done` holds, checking every 5 ms; fails the test naming `what` after 15 s.
pub async fn until(what: &str, done: impl AsyncFnMut() -> bool) {
    until_within(what, Duration::from_secs(15), done).await
}

/// [`until`], waiting at most `limit`.
pub async fn until_within(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends until the answer is not 409 `in_flight`: another holder of the Idempotency-Key
/// (the instance that took it over, the recovery sweep) is still finishing. Within 15 s.
pub async fn settled(mut send: impl AsyncFnMut() -> Reply) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let reply = send().await;
        if reply.status != 409 {
            return reply;
        }
        assert!(
            Instant::now() < deadline,
            "still in flight: {}",
            reply.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a test body once against SQLite and once against Postgres.
macro_rules! both_backends {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                ($body)(Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                ($body)(Backend::Postgres).await
            }
        }
    };
}
