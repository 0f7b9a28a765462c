//! The recovery sweep: an operation whose lease lapsed unfinished (its instance died, or
//! its client went away after a transient failure) is taken over by a live instance, as
//! the client's retry with the same Idempotency-Key would take it (a new fence: a zombie
//! owner can no longer write), resumed from its journal through the same loop, and its
//! answer saved for the client's retry. A charge made before a crash so gets its
//! confirmation. Bounded: after `recovery_max_attempts` takeovers the operation is
//! marked as needing attention and logged at error level.

use std::time::Duration;

use super::admission::Slot;
use super::resume::{Resume, ResumeError};
use super::state::AppState;
use crate::idempotency::Lapsed;
use crate::worker::{Worker, every};

/// The sweep: every lease period (at least 100 ms), for as long as the service runs.
pub struct Recovery(pub AppState);

impl Worker for Recovery {
    const NAME: &'static str = "recovery sweep";

    async fn run(self) {
        let app = &self.0;
        let lease = app.settings().idempotency.lease;
        every(lease.max(Duration::from_millis(100)), || sweep(app, lease)).await
    }
}

async fn sweep(app: &AppState, lease: Duration) {
    // An operation released after a transient failure is left to its client for one
    // more lease period; one whose owner died has been silent that long already.
    let lapsed = match app.records().lapsed(lease).await {
        Ok(lapsed) => lapsed,
        Err(err) => {
            tracing::warn!(error = %err, "recovery sweep: cannot look for lapsed operations");
            return;
        }
    };
    for operation in lapsed {
        // A resume runs a loop: it takes an admission slot like a client's checkout,
        // so a sweep after an outage cannot overload the instance. A full instance
        // leaves the rest for a later pass.
        let Some(slot) = app.admission().try_admit() else {
            tracing::debug!(
                "recovery sweep: the instance is full; lapsed operations wait for the next pass"
            );
            break;
        };
        Box::pin(recover(app, operation, slot)).await;
    }
}

async fn recover(app: &AppState, operation: Lapsed, slot: Slot) {
    let settings = app.settings();
    let max = i64::from(settings.idempotency.recovery_max_attempts);
    let (caller, key) = (operation.caller.clone(), operation.key.clone());
    if operation.recoveries >= max {
        match app.records().give_up(&operation, max).await {
            Ok(true) => tracing::error!(
                key,
                caller,
                recoveries = operation.recoveries,
                "recovery sweep: gave up on an operation resumed {} time(s) without finishing; it needs attention (idempotency_keys.attention_at is set; its journal, receipt and outbox rows say how far it got). A client's retry with its Idempotency-Key still resumes it",
                operation.recoveries
            ),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(key, error = %err, "recovery sweep: cannot mark an operation")
            }
        }
        return slot.unused();
    }
    let resume = match Resume::read(app, &caller, &key, &operation.request).await {
        Ok(resume) => resume,
        Err(err @ ResumeError::Unreadable(_)) => {
            tracing::error!(key, caller, error = %err, "recovery sweep: not resumed");
            return slot.unused();
        }
        Err(err) => {
            tracing::warn!(key, error = %err, "recovery sweep: cannot read the operation's caller");
            return slot.unused();
        }
    };
    let lease = match app
        .records()
        .recover(&operation, settings.idempotency.lease, max)
        .await
    {
        Ok(Some(lease)) => lease,
        // Its client's retry, or another instance's sweep, got there first.
        Ok(None) => return slot.unused(),
        Err(err) => {
            tracing::warn!(key, error = %err, "recovery sweep: cannot take an operation over");
            return slot.unused();
        }
    };
    tracing::warn!(
        key,
        caller = %resume.caller().name,
        fence = lease.fence,
        recovery = operation.recoveries + 1,
        of = max,
        "recovery sweep: took over an operation whose lease lapsed unfinished; resuming it from its journal"
    );
    let answer = resume.run(app, lease, slot).await;
    if answer.final_outcome {
        tracing::info!(
            key,
            status = answer.status.as_u16(),
            "recovery sweep: the operation finished; its answer is saved for the client's retry"
        );
    } else {
        tracing::warn!(
            key,
            status = answer.status.as_u16(),
            "recovery sweep: the operation did not finish; it is tried again later"
        );
    }
}
