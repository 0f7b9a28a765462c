//! The processes the benchmark starts: the service, the scripted model, the bare axum
//! floor servers (`floor-axum`, `floor-loop`), the load generator. Their logs go to
//! files under the work directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::load::{LoadArgs, LoadReport};

/// Where the binaries and the logs are.
#[derive(Clone, Debug)]
pub struct Env {
    /// The `checkout` binary.
    pub service_bin: PathBuf,
    /// This binary (for `load`, `floor-*`).
    pub bench_bin: PathBuf,
    /// Logs, SQLite files, records; the working directory of the service, so that it
    /// runs on its built-in defaults whatever config/default.toml is near.
    pub work: PathBuf,
    /// Where the results are written.
    pub out: PathBuf,
    /// Where `git` names the commit measured: the package's directory under cargo, else
    /// the current directory.
    pub source: PathBuf,
}

/// A running child, killed when dropped.
pub struct Running {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    /// The URL its start-up line named.
    pub url: String,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn pid_str(&self) -> String {
        self.child.id().to_string()
    }

    pub fn stop(mut self) {
        self.kill();
    }

    /// SIGTERM, then as long as `limit` for the process to end by itself (a process under
    /// valgrind writes its counts as it exits); SIGKILL after that.
    pub fn stop_within(mut self, limit: Duration) {
        self.kill_within(limit);
    }

    fn kill(&mut self) {
        self.kill_within(Duration::from_secs(5));
    }

    fn kill_within(&mut self, limit: Duration) {
        // SIGTERM first (graceful), then SIGKILL if it lingers.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

fn log_file(env: &Env, name: &str) -> Result<(PathBuf, std::fs::File), String> {
    let path = env.work.join(format!("{name}.log"));
    let file = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((path, file))
}

/// Spawns `command` with its output in `<work>/<name>.log`, and waits for a log line
/// holding `marker` followed by a URL.
pub fn start(env: &Env, name: &str, mut command: Command, marker: &str) -> Result<Running, String> {
    let (log, file) = log_file(env, name)?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    command
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err);
    let child = command
        .spawn()
        .map_err(|e| format!("cannot start {name}: {e}"))?;
    let mut running = Running {
        name: name.to_owned(),
        child,
        log,
        url: String::new(),
    };
    running.url = wait_for_url(&mut running, marker, Duration::from_secs(60))?;
    Ok(running)
}

fn wait_for_url(running: &mut Running, marker: &str, limit: Duration) -> Result<String, String> {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(&running.log).unwrap_or_default();
        if let Some(rest) = text.lines().find_map(|l| l.split(marker).nth(1)) {
            let url: String = rest
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '\u{1b}')
                .collect();
            return Ok(format!("http://{url}"));
        }
        if let Ok(Some(status)) = running.child.try_wait() {
            return Err(format!(
                "{} exited with {status} before it listened:\n{}",
                running.name,
                tail(&text)
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not listen within {limit:?}:\n{}",
                running.name,
                tail(&text)
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// `checkout scripted-model`: its URL is the base URL, `http://ADDR/v1`.
pub fn model(env: &Env, name: &str, delay_ms: u64, faults: &str) -> Result<Running, String> {
    model_on(env, name, "127.0.0.1:0", delay_ms, faults)
}

/// [`model`] on a given address (to start a model again where one was stopped).
pub fn model_on(
    env: &Env,
    name: &str,
    listen: &str,
    delay_ms: u64,
    faults: &str,
) -> Result<Running, String> {
    let mut command = Command::new(&env.service_bin);
    command
        .current_dir(&env.work)
        .args(["scripted-model", "--listen", listen])
        .args(["--delay-ms", &delay_ms.to_string()]);
    if !faults.is_empty() {
        command.args(["--faults", faults]);
    }
    start(env, name, command, "scripted model listening on http://")
}

/// The service's environment for one run.
pub fn service_command(env: &Env, database_url: &str, model_url: &str) -> Command {
    service_command_under(env, &[], database_url, model_url)
}

/// [`service_command`], the service run by `wrapper` (a program and its arguments, such
/// as valgrind's) when one is given.
pub fn service_command_under(
    env: &Env,
    wrapper: &[String],
    database_url: &str,
    model_url: &str,
) -> Command {
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(&env.service_bin);
            command
        }
        None => Command::new(&env.service_bin),
    };
    command
        .current_dir(&env.work)
        .env_remove("OPENAI_API_KEY")
        .env_remove("CHECKOUT_CONFIG")
        .env("CHECKOUT_LISTEN", "127.0.0.1:0")
        .env("CHECKOUT_LOG_FORMAT", "text")
        .env("DATABASE_URL", database_url)
        .env("OPENAI_BASE_URL", model_url);
    command
}

/// The service, on the defaults but for the database and the model.
pub fn service(
    env: &Env,
    name: &str,
    database_url: &str,
    model_url: &str,
    extra: &[(String, String)],
) -> Result<Running, String> {
    let mut command = service_command(env, database_url, model_url);
    for (k, v) in extra {
        command.env(k, v);
    }
    start(env, name, command, "listening on http://")
}

/// The bare axum floor server.
pub fn floor_axum(env: &Env) -> Result<Running, String> {
    let mut command = Command::new(&env.bench_bin);
    command.arg("floor-axum");
    start(
        env,
        "floor-axum",
        command,
        "floor axum listening on http://",
    )
}

/// `floor-loop`: the bare handler that makes a checkout's two POSTs to the model at
/// `model_url` (h2c with prior knowledge when `h2c`), in `wire`'s bodies, with its soft descriptor limit
/// raised to the hard limit first, as the service raises its own at start-up.
pub fn floor_loop(
    env: &Env,
    name: &str,
    model_url: &str,
    h2c: bool,
    wire: checkout::model::WireApi,
) -> Result<Running, String> {
    let mut command = Command::new("sh");
    command
        .current_dir(&env.work)
        .arg("-c")
        .arg(r#"ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$0" "$@""#)
        .arg(&env.bench_bin)
        .args(["floor-loop", "--model", model_url, "--wire", wire.as_str()]);
    if h2c {
        command.arg("--h2c");
    }
    start(env, name, command, "floor loop listening on http://")
}

/// Runs this binary with `args` and reads the JSON it prints.
pub fn run_json<T: serde::de::DeserializeOwned>(
    env: &Env,
    name: &str,
    args: &[String],
) -> Result<T, String> {
    let (log, file) = log_file(env, name)?;
    let output = Command::new(&env.bench_bin)
        .args(args)
        .stdin(Stdio::null())
        .stderr(file)
        .output()
        .map_err(|e| format!("cannot run {name}: {e}"))?;
    if !output.status.success() {
        let log_text = std::fs::read_to_string(&log).unwrap_or_default();
        return Err(format!(
            "{name} failed with {}:\n{}",
            output.status,
            tail(&log_text)
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| {
        format!(
            "{name} printed no report ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

pub fn load(env: &Env, name: &str, args: &LoadArgs) -> Result<LoadReport, String> {
    run_json(env, name, &args.to_args())
}

/// Removes a SQLite database and its companions.
pub fn remove_sqlite(path: &Path) {
    for suffix in ["", "-wal", "-shm", ".lock"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}
