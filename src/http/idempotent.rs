//! Running a piece of work once per `Idempotency-Key` (the header is read by
//! [`IdempotencyKey`](super::extract::IdempotencyKey)): replay a finished answer, refuse
//! a key reused for another request or still running, or run the work under a lease. Knows nothing of what the work is; a handler hands it a future.

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use tracing::Instrument;

use super::admission::Slot;
use super::answer::HttpAnswer;
use super::error::{Code, Problem};
use super::state::AppState;
use crate::idempotency::{self, Begin, Fingerprint, Lease, PAUSED, Saved};
use crate::metrics::KeyOutcome;
use crate::payments::OperationKey;

pub const REPLAYED: &str = "idempotent-replayed";

/// Runs `work` once for `key`: the first request with the key runs it and saves a final
/// answer; a repeat with the same `fingerprint` gets that answer back, byte for byte.
/// The work is given the lease it runs under (its fence names it to the journal) and the
/// admission slot it holds until it ends (also when its client has left).
///
/// Work runs only with an admission slot. When the instance is full, the record is only
/// read: a finished answer is replayed, a key in use or reused is refused as ever, and a
/// request that would run is refused with 503 `overloaded` before anything is written,
/// so its key stays usable.
///
/// What it is given, the record's calls and the claim are a box of their own, freed once
/// the work is under way: what waits for the work is the work's box and a few words. As
/// one `async fn`, every keyed operation held its arguments (the work's captures, the
/// fingerprint, the keys) and its claim's state for as long as it ran (bench figure 12
/// under heaptrack).
pub fn once<F>(
    app: AppState,
    caller: String,
    key: OperationKey,
    fingerprint: Fingerprint,
    work: impl FnOnce(&Lease, Slot) -> F + Send + 'static,
) -> impl Future<Output = Response> + Send + 'static
where
    F: Future<Output = HttpAnswer> + Send + 'static,
{
    let begin = Box::pin(claim(app, caller, key, fingerprint, work));
    async move {
        match begin.await {
            Ok(running) => running.await.into_response(),
            Err(answer) => answer,
        }
    }
}

/// [`once`] up to its work: the work under way ([`detached`]), or the answer without it.
async fn claim<F>(
    app: AppState,
    caller: String,
    key: OperationKey,
    fingerprint: Fingerprint,
    work: impl FnOnce(&Lease, Slot) -> F,
) -> Result<Detached, Response>
where
    F: Future<Output = HttpAnswer> + Send + 'static,
{
    let (app, caller, key) = (&app, caller.as_str(), &key);
    let settings = app.settings();
    let mut slot = app.admission().try_admit();
    let begun = match slot {
        // The record calls are boxed: this future lives as long as the request.
        Some(_) => {
            Box::pin(idempotency::begin(
                app.records(),
                caller,
                key.as_str(),
                &fingerprint,
                settings.idempotency.lease,
                settings.idempotency.ttl,
            ))
            .await
        }
        None => match Box::pin(idempotency::peek(
            app.records(),
            caller,
            key.as_str(),
            &fingerprint,
        ))
        .await
        {
            Ok(Some(found)) => Ok(found),
            Ok(None) => return Err(app.admission().refusal().into_response()),
            Err(err) => Err(err),
        },
    };
    // Not kept while the work runs (bench figure 12).
    drop(fingerprint);
    if !matches!(begun, Ok(Begin::Owner(_)))
        && let Some(slot) = slot.take()
    {
        slot.unused();
    }
    let outcome = match &begun {
        Ok(Begin::Owner(_)) => Some(KeyOutcome::New),
        Ok(Begin::Replay(_)) => Some(KeyOutcome::Replay),
        Ok(Begin::Mismatch) => Some(KeyOutcome::KeyReuse),
        Ok(Begin::InFlight { .. }) => Some(KeyOutcome::InFlight),
        Err(_) => None,
    };
    if let Some(outcome) = outcome {
        app.metrics().idempotency_key(outcome);
    }
    Err(match begun {
        Ok(Begin::Owner(lease)) => {
            // Only an admitted request claims a key (without a slot the record is read).
            let Some(slot) = slot else {
                return Err(app.admission().refusal().into_response());
            };
            let work = Box::pin(work(&lease, slot));
            return Ok(detached(owned(app.clone(), lease, work)));
        }
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
        Err(err) => Problem::unavailable(format!("cannot read the Idempotency-Key record: {err}; nothing was run"))
        .into_response(),
    })
}

/// Runs the work to its end, and its answer saved, even when the client goes away or the
/// server timeout gives up on the connection: the request polls it while it waits for
/// it, and hands it to a task of its own only if the request is dropped first. A task per
/// checkout, spawned and joined, had cost each one a wake-up of the other worker thread.
///
/// A panic in the work is answered 503, as a failed task was.
pub fn detached(work: impl Future<Output = HttpAnswer> + Send + 'static) -> Detached {
    Detached {
        work: Some(Box::pin(work)),
        span: tracing::Span::current(),
    }
}

/// The work of [`detached`]: see there.
pub struct Detached {
    /// `None` once it has answered.
    work: Option<BoxFuture<'static, HttpAnswer>>,
    /// The request's span, for the work's lines if it outlives the request.
    span: tracing::Span,
}

impl Future for Detached {
    type Output = HttpAnswer;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<HttpAnswer> {
        let work = self.work.as_mut().expect("polled after it answered");
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx)));
        let answer = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(answer)) => answer,
            Err(panic) => {
                let said = panic
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("a panic");
                tracing::error!(panic = said, "the checkout's work panicked");
                Problem::new(Code::Unavailable, format!("the task failed: {said}")).answer()
            }
        };
        self.work = None;
        Poll::Ready(answer)
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        // The request is gone before its work answered: the work goes on by itself.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let span = std::mem::replace(&mut self.span, tracing::Span::none());
            runtime.spawn(work.instrument(span));
        }
    }
}

/// Runs `work` under a lease the recovery sweep took: as [`once`] runs a new key's work
/// (renewed while it runs; the answer saved if final, else the lease released).
pub(crate) async fn resume(
    app: &AppState,
    lease: Lease,
    work: impl Future<Output = HttpAnswer> + Send + 'static,
) -> HttpAnswer {
    detached(owned(app.clone(), lease, Box::pin(work))).await
}

/// Renewals of this process's leases in flight at once: more wait for a turn before
/// their renewal's future (boxed: on SQLite a queued row, on Postgres a few KB once its
/// turn for a connection comes) is made. Every operation renews a third of a lease after
/// it began, so thousands that began together renew together: when the renewals queue
/// (on SQLite's group writer, whose queue and group hold 1,024; on the pool), each held
/// its future (bench figure 12, heaptrack at the peak: the renewals' boxes were the
/// largest thing live). More than the group writer and the pool take at once: no
/// renewal waits here for a statement that could run.
const RENEWALS_AT_ONCE: usize = 1024;
static RENEWALS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(RENEWALS_AT_ONCE);

/// The work under our lease: renewed while it runs, then the answer saved (a final
/// outcome) or the lease released (a transient failure: the key stays usable).
///
/// The work comes boxed and the record calls are boxed: an argument of an async fn keeps
/// its room in the future after it is moved, so an unboxed work would be held twice for
/// the operation's whole life, and the calls beside it.
async fn owned(app: AppState, lease: Lease, work: BoxFuture<'static, HttpAnswer>) -> HttpAnswer {
    let records = app.records().clone();
    let lease_for = app.settings().idempotency.lease;
    let renew = async {
        let mut tick = tokio::time::interval(lease_for / 3);
        tick.tick().await;
        loop {
            tick.tick().await;
            let renewed = {
                let _turn = RENEWALS.acquire().await.expect("never closed");
                records.renew(&lease, lease_for).await
            };
            match renewed {
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
    let mut answer = tokio::select! {
        answer = work => answer,
        () = renew => unreachable!("renewal never ends"),
    };
    if answer.saved {
        return answer;
    }
    let closing = std::mem::take(&mut answer.closing);
    let outcome = if answer.final_outcome {
        let saved = Saved {
            status: answer.status.as_u16(),
            content_type: answer.content_type.clone(),
            body: answer.body.to_vec(),
        };
        Box::pin(records.complete(&lease, &saved, closing)).await
    } else {
        Box::pin(records.release(&lease)).await
    };
    match outcome {
        Ok(true) => {}
        // A zombie: our lease lapsed and another instance took the key over. Its record
        // stands; the work's own keys made sure this run did nothing twice. A final
        // answer of ours would be a second answer for one key: the client is sent for
        // the one that instance saves, as a run that finds its lease lost mid-way is.
        Ok(false) => {
            tracing::warn!(key = %lease.key, fence = lease.fence, "the Idempotency-Key was taken over; this run's answer was not saved");
            if answer.final_outcome {
                return Problem::new(
                    Code::InFlight,
                    "another instance took this operation over after its lease lapsed; this run stopped, and the operation's answer is that instance's: repeat the request with the same Idempotency-Key",
                )
                .retry_after(1)
                .answer();
            }
        }
        Err(err) => {
            tracing::warn!(key = %lease.key, error = %err, "cannot save the answer of an Idempotency-Key; a retry runs the work again, and its own keys keep that safe")
        }
    }
    answer
}

/// The saved answer, byte for byte, marked as a replay.
pub(crate) fn replay(saved: Saved) -> Response {
    let status = axum::http::StatusCode::from_u16(saved.status)
        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut answer = HttpAnswer::new(status, &saved.content_type, saved.body);
    if saved.status == PAUSED {
        answer.location = approval_location(&answer.body);
    }
    let mut answer = answer.into_response();
    answer
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    answer
}

/// The `Location` of a saved 202: a paused operation's answer names its approval
/// (`{"approval": {"id"}}`, docs/approvals.md), which is where the decision is made.
fn approval_location(body: &[u8]) -> Option<String> {
    let paused: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(format!("/approvals/{}", paused["approval"]["id"].as_str()?))
}

fn whole_seconds(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}
