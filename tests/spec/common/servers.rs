//! The processes the specs start: a tool's path, free ports, and a server started on
//! them.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A tool `scripts/test` installs: the path in `env`, else `default` under the crate.
pub(crate) fn tool(env: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(default));
    assert!(
        path.exists(),
        "{} is missing: scripts/test installs it (or set {env})",
        path.display()
    );
    path
}

/// A port nobody listens on now, on 127.0.0.1 (anyone may take it next).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A server process given `N` free ports: `command` makes it for the ports, `ready` asks
/// it whether it serves. Such a server cannot be given port 0, so between [`free_port`]
/// and its `listen` another test's process may take a port; the server then exits
/// ("address already in use") and is started again on other ports, up to 5 times. Any
/// other exit, or no readiness within 15 s, fails with what the process printed.
pub(crate) async fn on_free_ports<const N: usize>(
    what: &str,
    command: impl Fn([u16; N]) -> Command,
    mut ready: impl AsyncFnMut([u16; N]) -> bool,
) -> (Child, [u16; N]) {
    for _ in 0..5 {
        let ports = std::array::from_fn(|_| free_port());
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let mut child = command(ports)
            .stdout(log.reopen().expect("a log file"))
            .stderr(log.reopen().expect("a log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        let output = || std::fs::read_to_string(log.path()).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            // A port taken by another process may hold the question unanswered.
            let answered = tokio::time::timeout(Duration::from_secs(1), ready(ports)).await;
            if answered == Ok(true) {
                return (child, ports);
            }
            if let Some(status) = child.try_wait().expect("the process's status") {
                let output = output();
                assert!(
                    output.to_lowercase().contains("address already in use"),
                    "{what} exited ({status}): {output}"
                );
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("{what} did not answer within 15 s: {}", output());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    panic!("{what} found a port taken at 5 starts");
}
