//! `checkout`: read the settings, start logging, build the app, serve until stopped.
//! `checkout scripted-model`: run the scripted model alone, as a provider for others.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use checkout::App;
use checkout::config::{LogFormat, Settings, Sources};
use checkout::model::scripted::{FaultRule, Script, ScriptedModel, describe};

const USAGE: &str = "\
usage: checkout [--config PATH] [--scripted-faults PLAN] [--scripted-delay-ms N]
       checkout scripted-model [--listen ADDR] [--faults PLAN] [--delay-ms N] [--api-key KEY]

Settings come from config/default.toml (or --config / CHECKOUT_CONFIG), then the
environment (DATABASE_URL, OPENAI_API_KEY, OPENAI_BASE_URL, OPENAI_MODEL, CHECKOUT_*).
A fault PLAN is FAULT[@ROUND][xTIMES][%PERCENT],... e.g. timeout@2x3 (see the README).";

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
    if args.first().map(String::as_str) == Some("scripted-model") {
        return runtime.block_on(scripted_model(&args[1..]));
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
        Err(err) => {
            tracing::error!("server failed: {err}");
            ExitCode::FAILURE
        }
    }
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
