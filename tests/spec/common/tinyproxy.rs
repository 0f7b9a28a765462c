//! Debian's `tinyproxy`, a real forward proxy (`scripts/test` installs it), on a free
//! loopback port with a config file of the test's own. Its log names each request that
//! went through it: `POST http://host:port/path` forwarded, `CONNECT host:port` tunnelled.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Tinyproxy {
    pub port: u16,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    /// Starts it and waits until it accepts connections. Fails, never skips, without
    /// the binary (`CHECKOUT_TEST_TINYPROXY`, else `tinyproxy` on the PATH).
    pub fn start() -> Tinyproxy {
        let dir = tempfile::tempdir().expect("a temp dir");
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let log = dir.path().join("tinyproxy.log");
        let config = dir.path().join("tinyproxy.conf");
        // No ConnectPort line: CONNECT to any port (the test's servers are on free ones).
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 60\nLogFile \"{}\"\nLogLevel Info\nMaxClients 100\nAllow 127.0.0.1\n",
                log.display()
            ),
        )
        .unwrap();
        let binary =
            std::env::var("CHECKOUT_TEST_TINYPROXY").unwrap_or_else(|_| "tinyproxy".into());
        let child = Command::new(&binary)
            .arg("-d")
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{binary} is required for this test (scripts/test installs it): {e}")
            });
        let proxy = Tinyproxy {
            port,
            child,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !proxy.log_text().contains("Accepting connections") {
            assert!(
                Instant::now() < deadline,
                "tinyproxy did not start: {}",
                proxy.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        proxy
    }

    /// `http://127.0.0.1:PORT`, for `HTTP_PROXY` or `HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The requests it took, in order, as `METHOD TARGET`: `POST http://…/v1/chat/completions`,
    /// `CONNECT 127.0.0.1:PORT`.
    pub fn requests(&self) -> Vec<String> {
        self.log_text()
            .lines()
            .filter_map(|line| {
                line.split("): ")
                    .nth(1)
                    .filter(|_| line.contains("Request (file descriptor"))
            })
            .map(|request| request.trim_end_matches(" HTTP/1.1").to_owned())
            .collect()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
