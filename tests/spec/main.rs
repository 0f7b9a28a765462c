//! The service's specification, one test binary: each module is one concern, read top to
//! bottom as what the service promises. Every HTTP test runs against SQLite and Postgres
//! (`both_backends!`); `scripts/test` provides the Postgres database.

#[macro_use]
mod common;

mod agui;
mod approval_links;
mod approvals;
mod auth;
mod budgets;
mod crash;
mod db_restart;
mod email;
mod endpoint;
mod failover;
mod failover_fenced;
mod faults;
mod hostile;
mod idempotency;
mod journal;
mod metrics;
mod migrate;
mod model_behaviour;
mod model_proxy;
mod outage;
mod overload;
mod process;
mod provider;
mod provider_stream;
mod real_server_answers;
mod reasoning;
mod refund_faults;
mod refund_provider;
mod refunds;
mod responses_outcomes;
mod responses_wire;
mod scopes;
mod silent_https;
mod store_contract;
mod streaming;
mod traces;
mod webhook_budgets;
mod webhook_delivery;
mod webhook_endpoints;
mod webhook_kill;
mod webhooks;
mod workers;
