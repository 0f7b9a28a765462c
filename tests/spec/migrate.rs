//! `checkout migrate`: the migrations applied by a command of their own, which exits, with
//! `DATABASE_URL` read as the service reads it (a host list included).

use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common::{Backend, TestDb};

fn migrate(url: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_checkout"))
        .arg("migrate")
        .env("DATABASE_URL", url)
        .env_remove("CHECKOUT_CONFIG")
        .env_remove("PGCONNECT_TIMEOUT")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run checkout migrate")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The migrations of `dialect` in the source tree.
fn migrations(dialect: &str) -> usize {
    std::fs::read_dir(format!(
        "{}/migrations/{dialect}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("the migrations directory")
    .filter(|e| e.as_ref().unwrap().path().extension() == Some("sql".as_ref()))
    .count()
}

/// On a fresh database `checkout migrate` applies every migration and exits 0; run again
/// it applies none and exits 0; the service's tables are there and each migration is
/// recorded once. The same on a SQLite file.
// Seen failing with `Database::migrate` running the migrations before it counted them:
// "left: \"checkout: 0 migration(s) applied now; the database has all 20\n\", right:
// \"checkout: 20 migration(s) applied now; …\"" on the fresh database.
#[tokio::test]
async fn migrate_creates_the_schema_on_a_fresh_database_and_then_finds_nothing_to_apply() {
    for (backend, dialect) in [(Backend::Postgres, "postgres"), (Backend::Sqlite, "sqlite")] {
        let db = TestDb::new(backend).await;
        let total = migrations(dialect);
        let first = migrate(&db.url);
        assert!(first.status.success(), "{dialect}: {}", stderr(&first));
        assert_eq!(
            stderr(&first),
            format!("checkout: {total} migration(s) applied now; the database has all {total}\n"),
            "{dialect}"
        );
        assert_eq!(
            db.count("SELECT count(*) FROM _sqlx_migrations WHERE success", None)
                .await,
            total as i64,
            "{dialect}"
        );
        assert_eq!(db.all_receipts().await, 0, "{dialect}: receipts is a table");
        let again = migrate(&db.url);
        assert!(again.status.success(), "{dialect}: {}", stderr(&again));
        assert_eq!(
            stderr(&again),
            format!("checkout: 0 migration(s) applied now; the database has all {total}\n"),
            "{dialect}"
        );
        assert_eq!(
            db.count("SELECT count(*) FROM _sqlx_migrations", None)
                .await,
            total as i64,
            "{dialect}"
        );
    }
}

/// A host list whose first host refuses connections (nothing listens on its port): the
/// walk reaches the second, and the migrations are applied there.
// Seen failing with the vendored walk reduced to the first host: exit 1, "cannot connect
// to the database: pool timed out while waiting for an open connection".
#[tokio::test]
async fn migrate_walks_a_host_list_past_a_host_that_is_down() {
    let db = TestDb::new(Backend::Postgres).await;
    let down = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = down.local_addr().unwrap().port();
    drop(down);
    let url = db.url.replacen(
        "127.0.0.1:5432",
        &format!("127.0.0.1:{port},127.0.0.1:5432"),
        1,
    );
    let output = migrate(&url);
    assert!(output.status.success(), "{}", stderr(&output));
    let total = migrations("postgres");
    assert_eq!(
        db.count("SELECT count(*) FROM _sqlx_migrations WHERE success", None)
            .await,
        total as i64
    );
}

/// A first host that accepts the TCP connection and never answers Postgres's start-up (a
/// listening socket nobody serves; a host gone without refusing behaves so): without a
/// connect timeout of its own each new connection would wait there until the pool's
/// acquire timeout (2 s) and never try the second host. The default gives each of the two
/// hosts half of it, so the walk moves on after 1 s and `checkout migrate` succeeds on
/// the second.
// Seen failing with `with_host_timeout` returning its options unchanged: exit 1, "cannot
// connect to the database: pool timed out while waiting for an open connection".
#[tokio::test]
async fn a_first_host_that_never_answers_is_passed_over_after_the_default_host_timeout() {
    let db = TestDb::new(Backend::Postgres).await;
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let url = db.url.replacen(
        "127.0.0.1:5432",
        &format!("127.0.0.1:{port},127.0.0.1:5432"),
        1,
    );
    let started = Instant::now();
    let output = migrate(&url);
    let took = started.elapsed();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        took >= Duration::from_secs(1),
        "the silent host was waited for its timeout: {took:?}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM _sqlx_migrations WHERE success", None)
            .await,
        migrations("postgres") as i64
    );
    drop(silent);
}

/// A `DATABASE_URL` the driver refuses stops `checkout migrate` with exit 2, naming it
/// and what is wrong.
// Seen failing with `migrate` exiting 1 on a bad setting: "left: Some(1), right:
// Some(2)".
#[test]
fn migrate_refuses_a_bad_host_list_with_exit_2_naming_database_url() {
    let output = migrate("postgres://postgres@127.0.0.1:5432,/checkout");
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let said = stderr(&output);
    assert!(
        said.contains("DATABASE_URL") && said.contains("host 2 is empty"),
        "{said}"
    );
}
