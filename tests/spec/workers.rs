//! The background workers (mail, the Idempotency-Key sweep, the API-key watch, the rate
//! limit's forgetting, the recovery sweep) run for as long as the service does: one that
//! ends or panics while it serves stops the service, with one error line, and `serve`'s
//! error, on which `main` exits non-zero (1).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checkout::worker::Worker;
use checkout::{App, ServeError};

use crate::common::{Backend, TestDb, client, scripted, test_settings};

/// A worker of the test's own: no worker of the service panics on any fault we could
/// make, so the test brings one, through the same door the app's own go through.
struct PanicsAfter(Duration);

impl Worker for PanicsAfter {
    const NAME: &'static str = "the test's panicking worker";

    async fn run(self) {
        tokio::time::sleep(self.0).await;
        panic!("a fault of its own");
    }
}

/// What the service logged, as its log format writes it.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Set in the process [`a_worker_that_panics_stops_the_service_with_one_error_line`]
/// starts of itself, which runs the test alone.
const ALONE: &str = "CHECKOUT_TEST_WORKERS_ALONE";

/// Seen failing without the watch: the service went on serving after the panic, and
/// `serve` did not end within the 20 s.
///
/// The test binary runs again with only this test in it: tracing caches each callsite's
/// interest for the whole process, and with other tests' threads registering callsites
/// beside it, the thread-local subscriber set here once missed the error line (CI, stop
/// 51: no ERROR line logged, every other assertion held). Alone in its process it sees
/// every event.
#[test]
fn a_worker_that_panics_stops_the_service_with_one_error_line() {
    if std::env::var_os(ALONE).is_some() {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(panicking_worker_stops_the_service());
    }
    let name = "workers::a_worker_that_panics_stops_the_service_with_one_error_line";
    let alone = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE, "1")
        .output()
        .expect("the test binary runs again");
    let out = String::from_utf8_lossy(&alone.stdout);
    let err = String::from_utf8_lossy(&alone.stderr);
    assert!(
        alone.status.success() && out.contains("1 passed"),
        "{}\n{out}\n{err}",
        alone.status
    );
}

// One thread, so that the log subscriber set here sees every task's events.
async fn panicking_worker_stops_the_service() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let db = TestDb::new(Backend::Sqlite).await;
    let model = scripted("").await;
    let settings = test_settings(&db, &model);
    let listener = tokio::net::TcpListener::bind(settings.server.listen)
        .await
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let mut app = App::build(settings).await.expect("the service starts");
    app.spawn_worker(PanicsAfter(Duration::from_millis(500)));

    let started = Instant::now();
    let serving = async {
        let ready = client()
            .get(format!("{base}/health/live"))
            .send()
            .await
            .unwrap();
        ready.status().as_u16()
    };
    let (served, status) = tokio::join!(
        tokio::time::timeout(
            Duration::from_secs(20),
            app.serve(listener, std::future::pending())
        ),
        serving
    );
    assert_eq!(status, 200, "it served until the worker panicked");
    let served = served.expect("the service stops when its worker panics");
    assert!(started.elapsed() >= Duration::from_millis(500));
    match served {
        Err(ServeError::Worker(ended)) => {
            assert_eq!(ended.name, "the test's panicking worker");
            assert_eq!(ended.how, "panicked: a fault of its own");
        }
        other => panic!("{other:?}"),
    }
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(
        errors[0].contains(
            "the background worker `the test's panicking worker` panicked: a fault of its own while the service ran; the service stops so that it is restarted"
        ),
        "{text}"
    );
    assert!(text.contains("stopped"), "{text}");
}
