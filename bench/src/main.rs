//! `checkout-bench`: measures the checkout service against its floor and its targets.
//!
//! `cargo run --release -p checkout-bench -- --quick` (under a minute) or without
//! `--quick` (the full run, under ten minutes). See `--help` and bench/README.md.
//! The same binary is the load generator (`load`) and the floor's bare parts
//! (`floor-axum`, `floor-reqwest`, `floor-sql`, `floor-loop`, `floor-webhook`), each run as a
//! process of its own.

mod args;
mod bench;
mod child;
mod floor;
mod floor_webhook;
mod load;
mod procfs;
mod real_model;
mod report;
mod sse;
mod svg;

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = args::Args::new(std::env::args().skip(1).collect());
    let result = match args.subcommand().as_deref() {
        None if args.flag("--real-model") => real_model::main(&mut args),
        None => bench::main(&mut args),
        Some("load") => load::main(&mut args),
        Some("floor-axum") => floor::axum_main(&mut args),
        Some("floor-reqwest") => floor::reqwest_main(&mut args),
        Some("floor-sql") => floor::sql_main(&mut args),
        Some("floor-loop") => floor::loop_main(&mut args),
        Some("floor-webhook") => floor_webhook::main(&mut args),
        Some(other) => Err(format!("unknown subcommand {other:?}; see --help")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("checkout-bench: {message}");
            ExitCode::from(2)
        }
    }
}
