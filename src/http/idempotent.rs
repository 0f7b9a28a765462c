//! `POST /checkout` with an `Idempotency-Key`: replay a finished answer, refuse a key
//! reused for another request or still running, or run the checkout under a lease.

use std::time::Duration;

use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::checkout::{Format, run};
use super::error::{Code, Problem};
use super::{Answer, AppState};
use crate::idempotency::{self, Begin, Fingerprint, Lease, Saved};
use crate::payments::{OperationKey, Order};

pub const REPLAYED: &str = "idempotent-replayed";

pub async fn checkout(
    app: AppState,
    scope: String,
    key: OperationKey,
    order: Order,
    format: Format,
) -> Response {
    let settings = app.settings();
    let fingerprint = Fingerprint::of_checkout(&order);
    let begun = idempotency::begin(
        app.records(),
        &scope,
        key.as_str(),
        &fingerprint,
        settings.idempotency.lease,
        settings.idempotency.ttl,
    )
    .await;
    match begun {
        Ok(Begin::Owner(lease)) => detached(owned(app, lease, key, order, format)).await.into_response(),
        Ok(Begin::Replay(saved)) => replay(saved),
        Ok(Begin::Mismatch) => Problem::new(
            Code::KeyReuse,
            format!(
                "Idempotency-Key {:?} was first used for another request (another order, amount or currency); a new request needs a new key",
                key.as_str()
            ),
        )
        .into_response(),
        Ok(Begin::InFlight { retry_after }) => Problem::new(
            Code::InFlight,
            format!(
                "a request with Idempotency-Key {:?} is still being processed; retry after it finishes",
                key.as_str()
            ),
        )
        .retry_after(whole_seconds(retry_after))
        .into_response(),
        Err(err) => Problem::new(
            Code::Unavailable,
            format!("cannot read the Idempotency-Key record: {err}; nothing was run"),
        )
        .retry_after(1)
        .into_response(),
    }
}

/// Runs the checkout in a task of its own, so that it finishes (and its answer is saved)
/// even when the client goes away or the server timeout gives up on the connection.
pub async fn detached(work: impl Future<Output = Answer> + Send + 'static) -> Answer {
    match tokio::spawn(work.in_current_span()).await {
        Ok(answer) => answer,
        Err(err) => Problem::new(
            Code::Unavailable,
            format!("the checkout task failed: {err}"),
        )
        .answer(),
    }
}

/// The checkout under our lease: renewed while it runs, then the answer saved (a final
/// outcome) or the lease released (a transient failure: the key stays usable).
async fn owned(
    app: AppState,
    lease: Lease,
    key: OperationKey,
    order: Order,
    format: Format,
) -> Answer {
    let records = app.records().clone();
    let lease_for = app.settings().idempotency.lease;
    let work = run(&app, order, key, format);
    let renew = async {
        let mut tick = tokio::time::interval(lease_for / 3);
        tick.tick().await;
        loop {
            tick.tick().await;
            match records.renew(&lease, lease_for).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(key = %lease.key, fence = lease.fence, "lost the Idempotency-Key lease to another instance; this run's answer will not be saved");
                    break;
                }
                Err(err) => {
                    tracing::warn!(key = %lease.key, error = %err, "cannot renew the Idempotency-Key lease")
                }
            }
        }
        std::future::pending::<()>().await;
    };
    let answer = tokio::select! {
        answer = work => answer,
        () = renew => unreachable!("renewal never ends"),
    };
    let outcome = if answer.final_outcome {
        let saved = Saved {
            status: answer.status.as_u16(),
            content_type: answer.content_type.clone(),
            body: answer.body.to_vec(),
        };
        records.complete(&lease, &saved).await
    } else {
        records.release(&lease).await
    };
    match outcome {
        Ok(true) => {}
        // A zombie: our lease lapsed and another instance took the key over. Its record
        // stands; the charge key made sure this run charged nothing twice.
        Ok(false) => {
            tracing::warn!(key = %lease.key, fence = lease.fence, "the Idempotency-Key was taken over; this run's answer was not saved")
        }
        Err(err) => {
            tracing::warn!(key = %lease.key, error = %err, "cannot save the answer of an Idempotency-Key; a retry runs the checkout again, and the charge key keeps that safe")
        }
    }
    answer
}

/// The saved answer, byte for byte, marked as a replay.
fn replay(saved: Saved) -> Response {
    let status = axum::http::StatusCode::from_u16(saved.status)
        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut answer = Answer::new(status, &saved.content_type, saved.body).into_response();
    answer
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    answer
}

fn whole_seconds(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}
