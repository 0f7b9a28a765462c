//! `checkout`: read the settings, start logging, build the app, serve until stopped.
//! `checkout scripted-model`: run the scripted model alone, as a provider for others.
//! `checkout api-keys create|list|revoke`: manage the callers' API keys in the database.
//! `checkout migrate`: apply the database's migrations and exit.
//! `checkout webhooks add|list|remove`: manage more webhook endpoints in the database.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use checkout::caller::{self, KeyError, KeySpec, Scopes};
use checkout::config::{Settings, Sources};
use checkout::db::{Database, Migrated};
use checkout::model::scripted::{FaultRule, Script, ScriptedModel, describe};
use checkout::telemetry::LogFormat;
use checkout::{App, ServeError, StartError};

const USAGE: &str = "\
usage: checkout [--config PATH] [--scripted-faults PLAN] [--scripted-delay-ms N]
       checkout scripted-model [--listen ADDR] [--faults PLAN] [--delay-ms N] [--api-key KEY]
       checkout api-keys create NAME [--scope checkout,refund,approve,read]
                [--approval-above USD:50.00,...] [--budget-per-day USD:500.00,...]
       checkout api-keys list | revoke NAME   [--config PATH]
       checkout migrate [--config PATH]
       checkout webhooks add URL [--events charge.succeeded,...] [--secret whsec_...]
       checkout webhooks list | remove ID   [--config PATH]

Settings come from config/default.toml (or --config / CHECKOUT_CONFIG), then the
environment (DATABASE_URL, OPENAI_API_KEY, OPENAI_BASE_URL, OPENAI_MODEL, CHECKOUT_*).
A fault PLAN is FAULT[@ROUND][xTIMES][%PERCENT],... e.g. timeout@2x3 (see docs/resilience.md).";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a == "--version" || a == "-V") {
        println!("checkout {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match args.first().map(String::as_str) {
        Some("migrate") => return runtime.block_on(migrate(&args[1..])),
        Some("scripted-model") => return runtime.block_on(scripted_model(&args[1..])),
        Some("api-keys") => return runtime.block_on(api_keys(&args[1..])),
        Some("webhooks") => return runtime.block_on(webhooks(&args[1..])),
        _ => {}
    }
    runtime.block_on(service(&args))
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("checkout: {message}\n{USAGE}");
    ExitCode::from(2)
}

/// Flag values: `--name value` or `--name=value`.
fn flags<'a>(args: &'a [String], known: &[&str]) -> Result<Vec<(&'a str, &'a str)>, String> {
    let mut out = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (arg.as_str(), None),
        };
        if !known.contains(&name) {
            return Err(format!("unknown argument {arg:?}"));
        }
        let value = match inline {
            Some(v) => v,
            None => iter
                .next()
                .ok_or_else(|| format!("{name} needs a value"))?
                .as_str(),
        };
        out.push((name, value));
    }
    Ok(out)
}

async fn service(args: &[String]) -> ExitCode {
    let flags = match flags(
        args,
        &["--config", "--scripted-faults", "--scripted-delay-ms"],
    ) {
        Ok(flags) => flags,
        Err(message) => return usage_error(&message),
    };
    let mut sources = Sources::from_env();
    for (name, value) in flags {
        match name {
            "--config" => sources.config_path = Some(PathBuf::from(value)),
            "--scripted-faults" => sources
                .overrides
                .push(("CHECKOUT_SCRIPTED_FAULTS", value.to_owned())),
            _ => sources
                .overrides
                .push(("CHECKOUT_SCRIPTED_DELAY_MS", value.to_owned())),
        }
    }
    let settings = match Settings::load(&sources) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("checkout: {err}");
            return ExitCode::from(2);
        }
    };
    let traces = match checkout::telemetry::init(settings.log_format) {
        Ok(traces) => traces,
        Err(err) => {
            eprintln!("checkout: {err}");
            return ExitCode::from(2);
        }
    };
    if traces.is_some() {
        tracing::info!("exporting traces over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT)");
    }
    if !settings.scripted.faults.is_empty() {
        tracing::warn!(plan = %describe(&settings.scripted.faults), "the scripted model will inject faults");
    }
    let listener = match tokio::net::TcpListener::bind(settings.server.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!("cannot listen on {}: {err}", settings.server.listen);
            return ExitCode::FAILURE;
        }
    };
    let app = match App::build(settings).await {
        Ok(app) => app,
        Err(err @ StartError::Setting(_)) => {
            tracing::error!("cannot start: {err}");
            return ExitCode::from(2);
        }
        Err(err) => {
            tracing::error!("cannot start: {err}");
            return ExitCode::FAILURE;
        }
    };
    let served = app.serve(listener, shutdown_signal()).await;
    if let Some(traces) = traces {
        // Blocks while the last spans are sent: off the runtime's threads.
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        // Logged, in one line, when it ended.
        Err(ServeError::Worker(_)) => ExitCode::FAILURE,
        Err(err) => {
            tracing::error!("{err}");
            ExitCode::FAILURE
        }
    }
}

/// `api-keys create NAME` prints the new key once, alone on stdout; `list` shows names and
/// times, never a key; `revoke NAME` refuses the key from the next request on. The
/// database is the service's (DATABASE_URL, or the config file's); a SQLite file can be
/// changed only while no service has it open.
async fn api_keys(args: &[String]) -> ExitCode {
    let (command, rest) = match args.split_first() {
        Some((command, rest)) => (command.as_str(), rest),
        None => return usage_error("api-keys needs create NAME, list or revoke NAME"),
    };
    let (name, flag_args) = match (command, rest.split_first()) {
        ("create" | "revoke", Some((name, flags))) if !name.starts_with("--") => {
            (Some(name.as_str()), flags)
        }
        ("create" | "revoke", _) => {
            return usage_error(&format!("api-keys {command} needs a NAME"));
        }
        ("list", _) => (None, rest),
        _ => return usage_error(&format!("api-keys: unknown command {command:?}")),
    };
    let mut sources = Sources::from_env();
    let known: &[&str] = match command {
        "create" => &[
            "--config",
            "--scope",
            "--approval-above",
            "--budget-per-day",
        ],
        _ => &["--config"],
    };
    // Checked before the database is opened: a bad value creates nothing.
    let mut spec = KeySpec::checkout();
    match flags(flag_args, known) {
        Ok(flags) => {
            for (flag, value) in flags {
                let read = match flag {
                    "--scope" => Scopes::parse(value).map(|s| spec.scopes = s),
                    "--approval-above" => own_limit(value).map(|l| spec.approval_above = l),
                    "--budget-per-day" => own_limit(value).map(|l| spec.budget_per_day = l),
                    _ => {
                        sources.config_path = Some(PathBuf::from(value));
                        Ok(())
                    }
                };
                if let Err(err) = read {
                    return usage_error(&format!("{flag} {value:?}: {err}"));
                }
            }
        }
        Err(message) => return usage_error(&message),
    }
    let db = match open_database(&sources).await {
        Ok(db) => db,
        Err(exit) => return exit,
    };
    let result = match (command, name) {
        ("create", Some(name)) => caller::create_with(&db, name, &spec).await.map(|new| {
            eprintln!(
                "checkout: API key {:?} created (scopes {}); it is shown only this once, keep it secret:",
                new.name, spec.scopes
            );
            println!("{}", new.key);
        }),
        ("revoke", Some(name)) => caller::revoke(&db, name).await.map(|()| {
            eprintln!("checkout: API key {name:?} revoked: refused from the next request on");
        }),
        _ => caller::list(&db).await.map_err(KeyError::from).map(|keys| {
            let row = |cells: [&str; 6]| {
                let [name, created, revoked, scopes, approval, budget] = cells;
                let line = format!(
                    "{name:<24} {created:<24} {revoked:<24} {scopes:<30} {approval:<20} {budget}"
                );
                println!("{}", line.trim_end());
            };
            row([
                "NAME",
                "CREATED",
                "REVOKED",
                "SCOPES",
                "APPROVAL_ABOVE",
                "BUDGET_PER_DAY",
            ]);
            for key in keys {
                let revoked = key.revoked_at.map_or_else(|| "-".to_owned(), rfc3339);
                row([
                    &key.name,
                    &rfc3339(key.created_at),
                    &revoked,
                    &key.scopes,
                    key.approval_above.as_deref().unwrap_or("-"),
                    key.budget_per_day.as_deref().unwrap_or("-"),
                ]);
            }
        }),
    };
    db.close().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err @ (KeyError::Store(_) | KeyError::Random(_))) => {
            eprintln!("checkout: {err}");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("checkout: {err}");
            ExitCode::from(2)
        }
    }
}

/// `webhooks add URL` stores an endpoint and prints its id (and the secret it made, once,
/// when none was given); `list` shows every endpoint (CHECKOUT_WEBHOOK_URL's as `env`),
/// its secret cut short; `remove ID` stops its deliveries (not `env`'s: the setting's).
/// A bad URL, event type or secret stores nothing (exit 2).
async fn webhooks(args: &[String]) -> ExitCode {
    use checkout::webhooks::endpoints::{self, NewEndpoint};
    let (command, target, flag_args) = match args.split_first() {
        Some((c, rest)) if c == "list" => (c.as_str(), None, rest),
        Some((c, rest)) if c == "add" || c == "remove" => match rest.split_first() {
            Some((t, flags)) if !t.starts_with("--") => (c.as_str(), Some(t.as_str()), flags),
            _ => {
                return usage_error(&format!(
                    "webhooks {c} needs {}",
                    if c == "add" { "a URL" } else { "an ID" }
                ));
            }
        },
        Some((c, _)) => return usage_error(&format!("webhooks: unknown command {c:?}")),
        None => return usage_error("webhooks needs add URL, list or remove ID"),
    };
    let known: &[&str] = if command == "add" {
        &["--config", "--events", "--secret"]
    } else {
        &["--config"]
    };
    let mut sources = Sources::from_env();
    let (mut events, mut secret) = (None, None);
    match flags(flag_args, known) {
        Ok(flags) => {
            for (flag, value) in flags {
                match flag {
                    "--events" => events = Some(value),
                    "--secret" => secret = Some(value),
                    _ => sources.config_path = Some(PathBuf::from(value)),
                }
            }
        }
        Err(message) => return usage_error(&message),
    }
    if command == "remove" && target == Some(endpoints::ENV) {
        eprintln!(
            "checkout: webhook endpoint {} is CHECKOUT_WEBHOOK_URL's: unset the setting, and it is removed when the service starts",
            endpoints::ENV
        );
        return ExitCode::from(2);
    }
    // Checked before the database is opened: a bad value stores nothing.
    let new = match (command, target) {
        ("add", Some(url)) => match NewEndpoint::parse(url, events, secret) {
            Ok(new) => Some(new),
            Err(err) => return usage_error(&format!("webhooks add: {err}")),
        },
        _ => None,
    };
    let db = match open_database(&sources).await {
        Ok(db) => db,
        Err(exit) => return exit,
    };
    let done = match (new, target) {
        (Some(new), _) => endpoints::add(&db, &new).await.map(|id| {
            eprintln!(
                "checkout: webhook endpoint {id} added: {} gets {} from now on",
                new.url,
                endpoints::events_text(new.events)
            );
            println!("{id}");
            if new.generated {
                eprintln!("checkout: its signing secret, shown only this once, keep it secret:");
                println!("{}", new.secret.expose());
            }
            true
        }),
        (None, Some(id)) => endpoints::remove(&db, id).await.inspect(|removed| {
            if *removed {
                eprintln!("checkout: webhook endpoint {id} removed: nothing more is sent to it");
            } else {
                eprintln!("checkout: no webhook endpoint {id}");
            }
        }),
        (None, None) => endpoints::list(&db).await.map(|all| {
            println!(
                "{:<36} {:<10} {:<22} {:<40} URL",
                "ID", "STATUS", "SECRET", "EVENTS"
            );
            for e in all {
                let status = if e.disabled_at.is_some() {
                    "disabled"
                } else {
                    "enabled"
                };
                let events = endpoints::events_text(e.events);
                println!(
                    "{:<36} {status:<10} {:<22} {events:<40} {}",
                    e.id,
                    e.shown_secret(),
                    e.url
                );
            }
            true
        }),
    };
    db.close().await;
    match done {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(err) => {
            eprintln!("checkout: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `migrate` applies the migrations the database lacks (the service does it too when it
/// starts) and says how many, then exits: 0 when the schema is whole, 1 when the
/// database could not be reached or a migration failed, 2 for a bad setting.
async fn migrate(args: &[String]) -> ExitCode {
    let mut sources = Sources::from_env();
    match flags(args, &["--config"]) {
        Ok(flags) => {
            for (_, value) in flags {
                sources.config_path = Some(PathBuf::from(value));
            }
        }
        Err(message) => return usage_error(&message),
    }
    let settings = match Settings::load(&sources) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("checkout: {err}");
            return ExitCode::from(2);
        }
    };
    let migrated = match Database::connect(&settings.database.url, &settings.database.pool).await {
        Ok(db) => {
            let migrated = db.migrate().await;
            db.close().await;
            migrated
        }
        Err(err) => Err(err),
    };
    match migrated {
        Ok(Migrated { applied, total }) => {
            eprintln!("checkout: {applied} migration(s) applied now; the database has all {total}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("checkout: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The database of the settings, its migrations applied, for a command of the binary's
/// own: a bad setting exits 2, a database that cannot be opened 1, each said on stderr.
async fn open_database(sources: &Sources) -> Result<Database, ExitCode> {
    let settings = Settings::load(sources).map_err(|err| {
        eprintln!("checkout: {err}");
        ExitCode::from(2)
    })?;
    Database::open(&settings.database.url, &settings.database.pool)
        .await
        .map_err(|err| {
            eprintln!("checkout: {err}");
            ExitCode::FAILURE
        })
}

/// A key's own limit: `USD:50.00,EUR:40.00`; empty is none (the setting decides).
fn own_limit(value: &str) -> Result<Option<checkout::payments::PerCurrency>, String> {
    let limit = checkout::payments::PerCurrency::parse(value)?;
    Ok((!limit.is_empty()).then_some(limit))
}

fn rfc3339(epoch_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(epoch_ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| epoch_ms.to_string())
}

async fn scripted_model(args: &[String]) -> ExitCode {
    let flags = match flags(args, &["--listen", "--faults", "--delay-ms", "--api-key"]) {
        Ok(flags) => flags,
        Err(message) => return usage_error(&message),
    };
    let mut listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut script = Script::default();
    for (name, value) in flags {
        let parsed = match name {
            "--listen" => value
                .parse()
                .map(|a| listen = a)
                .map_err(|_| format!("--listen: {value:?} is not an address")),
            "--faults" => FaultRule::parse_plan(value).map(|f| script.faults = f),
            "--delay-ms" => value
                .parse()
                .map(|ms| script.delay = Duration::from_millis(ms))
                .map_err(|_| format!("--delay-ms: {value:?} is not a whole number")),
            _ => {
                script.api_key = Some(value.to_owned());
                Ok(())
            }
        };
        if let Err(message) = parsed {
            return usage_error(&message);
        }
    }
    // The scripted model makes no GenAI spans: logs only, whatever OTEL_* says.
    checkout::telemetry::init_logs(LogFormat::Text);
    let model = match ScriptedModel::start(listen, script).await {
        Ok(model) => model,
        Err(err) => {
            tracing::error!("cannot listen on {listen}: {err}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(addr = %model.addr(), "scripted model listening on {}", model.base_url());
    shutdown_signal().await;
    ExitCode::SUCCESS
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
