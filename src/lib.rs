//! checkout: an AI assistant takes a payment through a tool-calling loop, and no retry,
//! at any level, charges an order twice. `main.rs` runs this library; tests and the
//! benchmark drive it the same way.
//!
//! The flow, one module a stage: [`http`] (handler: validate, mint keys) ->
//! [`assistant`] (the loop and its tools, journaled in [`journal`]) -> [`model`] (the
//! chat-completions client) and [`payments`] (gateway, receipts, provider) and
//! [`outbox`] (the confirmation email). [`app`] wires them once.

pub mod app;
pub mod approvals;
pub mod assistant;
pub mod caller;
pub mod config;
pub mod db;
pub mod http;
pub mod idempotency;
pub mod journal;
pub mod metrics;
pub mod model;
pub mod outbox;
pub mod payments;
pub mod retry;
pub mod secret;
pub mod telemetry;
pub mod webhooks;
pub mod worker;

pub use app::{App, ServeError, StartError};
