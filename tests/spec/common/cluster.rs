//! A primary and a streaming standby of the test's own, on 127.0.0.1 only, made with the
//! machine's PostgreSQL 15 (`initdb`, `pg_basebackup`; `CHECKOUT_TEST_PG_BIN` names
//! another bin directory). Each server's data directory is in a temporary directory; the
//! servers are stopped (`pg_ctl stop -m immediate`, then the postmaster killed if it
//! lingers) and the directory removed when the cluster is dropped, a failed test's too.
//! Every command is bounded in time. As root, the commands run as user `postgres`
//! (`runuser`): Postgres refuses to run as root.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::servers::free_port;

/// How the standby acknowledges the primary's commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = '*'`, `synchronous_commit = on`: a commit is
    /// acknowledged once the standby has it on disk.
    Synchronous,
    /// No synchronous standby: a commit is acknowledged once the primary has it.
    Asynchronous,
}

pub struct Server {
    pub port: u16,
    pub data: PathBuf,
}

pub struct Cluster {
    bin: PathBuf,
    pub primary: Server,
    pub standby: Server,
    /// Removed after the servers are stopped (fields drop after `Drop::drop`).
    dir: tempfile::TempDir,
}

fn bin_dir() -> PathBuf {
    let bin = std::env::var("CHECKOUT_TEST_PG_BIN")
        .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    let bin = PathBuf::from(bin);
    for tool in ["initdb", "pg_ctl", "pg_basebackup", "postgres"] {
        assert!(
            bin.join(tool).is_file(),
            "the failover specs need PostgreSQL's server binaries and {} is missing: install \
             postgresql-15 (Debian) or set CHECKOUT_TEST_PG_BIN to the directory holding initdb, \
             pg_ctl, pg_basebackup and postgres",
            bin.join(tool).display()
        );
    }
    bin
}

fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl Cluster {
    /// A primary with a database `checkout`, and a standby streaming from it, caught up.
    pub fn start(replication: Replication) -> Cluster {
        let bin = bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("checkout-failover-")
            .tempdir()
            .expect("a temp dir");
        let primary = Server {
            port: free_port(),
            data: dir.path().join("primary"),
        };
        let standby = Server {
            port: free_port(),
            data: dir.path().join("standby"),
        };
        let cluster = Cluster {
            bin,
            primary,
            standby,
            dir,
        };
        if as_root() {
            cluster.run_plain("chown", &["postgres:postgres", &cluster.dir()]);
        }
        let data = cluster.primary.data.display().to_string();
        cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        let sync = match replication {
            Replication::Synchronous => "'*'",
            Replication::Asynchronous => "''",
        };
        cluster.configure(
            &cluster.primary,
            &format!(
                "wal_level = replica\nmax_wal_senders = 4\nhot_standby = on\n\
                 synchronous_standby_names = {sync}\nsynchronous_commit = on\n\
                 wal_keep_size = '64MB'\n"
            ),
        );
        cluster.pg_ctl(&cluster.primary, &["start"]);
        let standby_data = cluster.standby.data.display().to_string();
        cluster.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &cluster.primary.port.to_string(),
                "-U",
                "postgres",
                "-D",
                &standby_data,
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ],
        );
        // The primary's settings came with the base backup: once promoted, the standby has
        // no standby of its own to wait for.
        cluster.configure(&cluster.standby, "synchronous_standby_names = ''\n");
        cluster.pg_ctl(&cluster.standby, &["start"]);
        cluster.sql(&cluster.primary, "CREATE DATABASE checkout");
        cluster.until("the standby streams from the primary", || {
            let expected = match replication {
                Replication::Synchronous => "streaming sync",
                Replication::Asynchronous => "streaming async",
            };
            cluster.sql(
                &cluster.primary,
                "SELECT state || ' ' || sync_state FROM pg_stat_replication",
            ) == expected
                && cluster.sql(
                    &cluster.standby,
                    "SELECT count(*) FROM pg_database WHERE datname = 'checkout'",
                ) == "1"
        });
        cluster
    }

    fn dir(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// The settings every server of the cluster shares, then `extra`: loopback only, its
    /// own port and socket directory, no fsync (the specs crash processes, not the machine).
    fn configure(&self, server: &Server, extra: &str) {
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
             fsync = off\nmax_connections = 100\n{extra}",
            server.port,
            self.dir()
        );
        let path = server.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).expect("postgresql.conf");
        text.push_str(&conf);
        std::fs::write(&path, text).expect("write postgresql.conf");
    }

    /// `pg_ctl -D <data> -w -t 30 <args>`, with the server's log in the temp dir.
    pub fn pg_ctl(&self, server: &Server, args: &[&str]) {
        let data = server.data.display().to_string();
        let log = format!("{}.log", data);
        let mut all = vec!["-D", &data, "-l", &log, "-w", "-t", "30"];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all);
    }

    /// The server's log as it is now (`pg_ctl -l`).
    pub fn log(&self, server: &Server) -> String {
        std::fs::read_to_string(format!("{}.log", server.data.display())).unwrap_or_default()
    }

    /// Crashes the server: every process of it killed at once, nothing flushed.
    pub fn crash(&self, server: &Server) {
        self.pg_ctl(server, &["stop", "-m", "immediate"]);
    }

    /// Makes the standby a primary; returns once it accepts writes.
    pub fn promote(&self, server: &Server) {
        self.pg_ctl(server, &["promote"]);
    }

    /// One statement through `psql` on the server, its one value as text.
    pub fn sql(&self, server: &Server, statement: &str) -> String {
        self.sql_on(server, "postgres", statement)
    }

    /// [`sql`](Self::sql) in the database `checkout`.
    pub fn sql_checkout(&self, server: &Server, statement: &str) -> String {
        self.sql_on(server, "checkout", statement)
    }

    fn sql_on(&self, server: &Server, database: &str, statement: &str) -> String {
        let output = self.output(
            "psql",
            &[
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                &server.port.to_string(),
                "-U",
                "postgres",
                "-d",
                database,
                "-c",
                statement,
            ],
        );
        assert!(
            output.status.success(),
            "psql on port {}: {statement}: {}",
            server.port,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Returns once the server accepts connections (after a crash and restart of its own).
    pub fn until_up(&self, server: &Server) {
        self.until("the server accepts connections", || {
            self.output(
                "psql",
                &[
                    "-X",
                    "-q",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &server.port.to_string(),
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                    "-c",
                    "SELECT 1",
                ],
            )
            .status
            .success()
        });
    }

    fn until(&self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let output = self.output(tool, args);
        assert!(
            output.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// A tool of the bin directory, as `postgres` when we are root, killed after 60 s.
    fn output(&self, tool: &str, args: &[&str]) -> Output {
        let path = self.bin.join(tool).display().to_string();
        let mut command = match as_root() {
            true => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--", "timeout", "60", &path]);
                c
            }
            false => {
                let mut c = Command::new("timeout");
                c.args(["60", &path]);
                c
            }
        };
        command
            .args(args)
            .env_remove("PGTARGETSESSIONATTRS")
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"))
    }

    fn run_plain(&self, program: &str, args: &[&str]) {
        let status = Command::new(program)
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        assert!(status.success(), "{program} {args:?}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for server in [&self.primary, &self.standby] {
            let _ = self.output(
                "pg_ctl",
                &[
                    "-D",
                    &server.data.display().to_string(),
                    "-m",
                    "immediate",
                    "-t",
                    "10",
                    "stop",
                ],
            );
            // Should pg_ctl have failed, the postmaster named by its pid file, if it is
            // still this server's.
            if let Some(pid) = postmaster_of(&server.data) {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        }
    }
}

/// The pid of the postmaster running on `data`, if one is.
fn postmaster_of(data: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let pid = text.lines().next()?.trim().to_owned();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline)
        .contains(&*data.to_string_lossy())
        .then_some(pid)
}
