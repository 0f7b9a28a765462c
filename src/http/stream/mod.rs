//! An operation as a stream of AG-UI events (docs/streaming.md): `Accept:
//! text/event-stream` on `POST /checkout`, `POST /agui`, and the resumption
//! `GET /operations/{operationKey}/events` with `Last-Event-ID`.
//!
//! Every stream is read from the journal, whichever instance runs the operation, so the
//! events a reconnect replays and those it sees live are the same rows, in the same
//! order, with the same ids. It reads again when woken: by the commit of one of the
//! operation's rows in this process (`journal::wake`) or the end of its task here; an
//! operation running elsewhere wakes nothing here, so its streams also poll (its rows,
//! and its record for the end). The stream only reads: a stream that goes away stops
//! nothing.

pub mod events;
mod live;
mod out;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use events::{AgUiEvent, Position};
use live::{Live, Waited};
use out::{Followed, Out};

use crate::journal::wake::Follow;

use super::admission::Slot;
use super::answer::HttpAnswer;
use super::error::{Code, Problem};
use super::idempotent;
use super::state::AppState;
use crate::db::StoreError;
use crate::idempotency::{Fingerprint, Lease, Saved};
use crate::payments::OperationKey;

/// One Server-Sent Event of a stream, as the API document describes it.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct StreamEvent {
    /// The event's place in the operation's journal, `STEP` or `STEP.SUB`; none on the
    /// run's last event.
    #[schema(example = "1.2")]
    id: Option<String>,
    /// One AG-UI event as JSON text, its `type` inside.
    #[schema(example = "{\"type\":\"TOOL_CALL_END\",\"toolCallId\":\"call_1\"}")]
    data: String,
}

/// How often a stream of an operation that runs elsewhere ([`Finish::Record`]) reads
/// its journal and record, woken or not.
pub const POLL: Duration = Duration::from_millis(100);

/// How often a stream of an operation whose task runs here ([`Finish::Task`]) reads its
/// journal unwoken: only if another instance took the operation over (its rows then
/// commit there, and wake nothing here) does a read find what no wake-up announced.
pub const SAFETY_POLL: Duration = Duration::from_secs(5);

/// Whether the request asks for the event stream, as an extractor: read from the
/// request's headers in place, where a `HeaderMap` argument is a copy of them that a
/// handler keeps for as long as its checkout waits.
pub struct Wanted(pub bool);

impl<S: Send + Sync> FromRequestParts<S> for Wanted {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Wanted(wanted(&parts.headers)))
    }
}

/// Whether the request asks for the event stream (`Accept: text/event-stream`).
pub fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            range
                .split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// What ends a stream.
pub enum Finish {
    /// The operation runs in this task; its answer ends the stream.
    Task(JoinHandle<Response>),
    /// The operation's record: its saved answer ends the stream.
    Record,
    /// The operation's answer, already in (status, body).
    Answered(u16, Vec<u8>),
}

/// Which operation a stream follows, and from where.
pub struct Tail {
    pub app: AppState,
    /// Whose operation.
    pub owner: String,
    /// The operation's key, which is also the AG-UI `threadId`.
    pub key: String,
    pub run_id: String,
    /// The last place the client has (`Last-Event-ID`); `None`: from `RUN_STARTED` on.
    pub after: Option<Position>,
    /// A new run that goes on from `after` (an interrupt's resume): it starts with its
    /// own `RUN_STARTED`, which has no place in the journal.
    pub announce: bool,
    /// Its wake-ups on the commits of the operation's rows here, registered when the tail
    /// is made: before the operation's task starts, so none of its commits goes unseen.
    pub follow: Follow,
    /// The operation's key was leased for the first time (fence 1): nothing of it is
    /// journaled yet, and the stream does not read the journal until woken.
    pub fresh: bool,
}

impl Tail {
    /// A stream of `owner`'s operation `key` from its start, registered for the
    /// operation's wake-ups now: before its task starts, so none of its commits goes
    /// unseen.
    pub fn new(app: &AppState, owner: &str, key: &str, run_id: String) -> Tail {
        Tail {
            follow: app.wake().follow(owner, key),
            fresh: false,
            app: app.clone(),
            owner: owner.to_owned(),
            key: key.to_owned(),
            run_id,
            after: None,
            announce: false,
        }
    }
}

/// The stream as an SSE response: its body polls the follower that reads the journal
/// (out.rs), and drops it when the client goes away (the operation goes on).
pub fn respond(tail: Tail, finish: Finish) -> Response {
    let out = Out::default();
    let follower = follow(tail, finish, out.clone());
    Sse::new(Followed::new(follower, out))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn sse(event: &AgUiEvent) -> Event {
    let data = Event::default().data(event.body.to_string());
    match event.id {
        Some(id) => data.id(id.to_string()),
        None => data,
    }
}

/// Sends the operation's events after `tail.after` as its journal grows, then its last.
async fn follow(tail: Tail, mut finish: Finish, out: Out) {
    let mut at = match tail.after {
        Some(after) => {
            if tail.announce {
                let mut started = events::run_started(&tail.key, &tail.run_id);
                started.id = None;
                out.send(sse(&started)).await;
            }
            after
        }
        None => {
            let started = events::run_started(&tail.key, &tail.run_id);
            out.send(sse(&started)).await;
            Position::default()
        }
    };
    let lease = tail.app.settings().idempotency.lease;
    let mut lapsed_since: Option<Instant> = None;
    let mut live = Live::watch(tail.app.live(), &tail.owner, &tail.key);
    let mut follow = tail.follow;
    // The charge call an approval waits on, in the journal as last read (the last event
    // names it): the rows themselves are not kept while the stream waits (bench figure
    // 12).
    let mut call = None;
    // The operation runs here and nothing of it committed since the last read (or it
    // has none yet): the rows are those read, and their events are sent.
    let mut unchanged = tail.fresh;
    loop {
        // Before the reads: a row that commits during them is news to the wait below.
        follow.mark();
        // Whether it ended is asked first: what an ended operation did is journaled.
        let ended = match &mut finish {
            Finish::Task(_) => None,
            Finish::Answered(status, body) => Some((*status, std::mem::take(body))),
            Finish::Record => match record_status(&tail.app, &tail.owner, &tail.key).await {
                Ok(Some(Ok(saved))) => Some((saved.status, saved.body)),
                Ok(Some(Err(left))) if left.is_zero() => {
                    // Released or lapsed: a retry or the recovery sweep may take it over.
                    let since = *lapsed_since.get_or_insert_with(Instant::now);
                    (since.elapsed() > lease * 2).then(|| problem(
                        Code::Unavailable,
                        "the operation stopped before its answer; repeat its request with the same Idempotency-Key to resume it".into(),
                    ))
                }
                Ok(Some(Err(_))) => {
                    lapsed_since = None;
                    None
                }
                Ok(None) => Some(problem(
                    Code::NotFound,
                    format!("there is no operation {:?}", tail.key),
                )),
                Err(err) => {
                    tracing::warn!(error = %err, "a stream cannot read its operation's record; trying again");
                    None
                }
            },
        };
        let read = match std::mem::take(&mut unchanged) {
            true => Ok(Vec::new()),
            false => read_journal(&tail.app, &tail.owner, &tail.key).await,
        };
        let entries = match read {
            Ok(entries) => entries,
            Err(err) => {
                tracing::warn!(error = %err, "a stream cannot read its operation's journal; trying again");
                if let Some((status, body)) = ended {
                    finish = Finish::Answered(status, body);
                }
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        // Live text (id-less) comes between the journal's events: see live.rs.
        // The journal's events, with the live text sent meanwhile fitted in (live.rs),
        // then the live text that may go now. Dropped once sent: kept while the stream
        // waited, every waiting stream held its journal's events as JSON (figure 12).
        if !entries.is_empty() {
            call = events::waiting_call(&entries);
        }
        let made = (entries.iter())
            .flat_map(|entry| live.of_step(&tail.key, entry))
            .collect::<Vec<AgUiEvent>>();
        drop(entries);
        for event in made.into_iter().chain(live.flush(&tail.key)) {
            match event.id {
                Some(id) if id <= at => continue,
                Some(id) => at = id,
                None => {}
            }
            out.send(sse(&event)).await;
        }
        if let Some((status, body)) = ended {
            let last = events::last(&tail.key, &tail.run_id, status, &body, call);
            for event in live.close().iter().chain([&last]) {
                out.send(sse(event)).await;
            }
            return;
        }
        let thread = &tail.key;
        match &mut finish {
            Finish::Task(run) => {
                let waited = {
                    let wait = std::pin::pin!(async {
                        tokio::select! {
                            () = follow.changed() => None,
                            _ = tokio::time::sleep(SAFETY_POLL) => None,
                            done = run => Some(done),
                        }
                    });
                    live.relay(thread, &out, wait).await
                };
                match waited {
                    Waited::Done(None) | Waited::Behind => {}
                    Waited::Done(Some(done)) => {
                        // Its rows all committed here before its task ended, each commit
                        // news to `follow`: with none since the last read, it has them all.
                        unchanged = !follow.has_changed();
                        let (status, body) = answer_of(done).await;
                        finish = Finish::Answered(status, body);
                    }
                }
            }
            Finish::Record => {
                let wait = std::pin::pin!(async {
                    tokio::select! {
                        () = follow.changed() => {}
                        _ = tokio::time::sleep(POLL) => {}
                    }
                });
                live.relay(thread, &out, wait).await;
            }
            Finish::Answered(..) => {}
        }
    }
}

/// Journal reads of this process's streams at once. The others wait their turn before
/// their read's future is made: when the first round ends for 10,000 streams within a
/// second, each woken by its charge's commit, their reads queued on the pool's
/// connections each held one (bench figure 12, heaptrack at the peak).
const READS_AT_ONCE: usize = 64;
static READS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(READS_AT_ONCE);

/// The operation's journal, read in turn ([`READS_AT_ONCE`]); boxed, as the record's.
async fn read_journal(
    app: &AppState,
    owner: &str,
    key: &str,
) -> Result<Vec<crate::journal::Entry>, StoreError> {
    let _turn = READS
        .acquire()
        .await
        .expect("the semaphore is never closed");
    Box::pin(crate::journal::read(app.db(), owner, key)).await
}

/// The operation's record as it stands. Its read is boxed, as the journal's: inline, each
/// would make every stream's follower as large as itself for the stream's whole life.
async fn record_status(
    app: &AppState,
    owner: &str,
    key: &str,
) -> Result<Option<Result<Saved, Duration>>, StoreError> {
    Box::pin(app.records().status(owner, key)).await
}

/// The status and body of the task's answer.
async fn answer_of(done: Result<Response, tokio::task::JoinError>) -> (u16, Vec<u8>) {
    match done {
        Ok(response) => {
            let status = response.status().as_u16();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap_or_default();
            (status, body.to_vec())
        }
        Err(err) => problem(Code::Unavailable, format!("the task failed: {err}")),
    }
}

fn problem(code: Code, detail: String) -> (u16, Vec<u8>) {
    let problem = Problem::new(code, detail);
    let body = serde_json::to_vec(&*problem.body).unwrap_or_default();
    (problem.body.status, body)
}

/// Runs `work` once for `key` as [`idempotent::once`] does, and answers its events: live
/// when this request runs it, replayed when the key's answer is saved. A request that
/// runs nothing (the key in use or reused, the instance full) gets its problem as ever.
///
/// Not an `async fn`: the task starts here, and what waits for its claim is the tail, the
/// task's handle and the claim's answer, where an `async fn` kept its arguments (the
/// work's captures, the fingerprint, the keys) beside them while thousands of claims
/// queue (bench figure 12).
pub fn once<F>(
    app: AppState,
    caller: String,
    key: OperationKey,
    fingerprint: Fingerprint,
    run_id: String,
    work: impl FnOnce(&Lease, Slot) -> F + Send + 'static,
) -> impl Future<Output = Response> + Send + 'static
where
    F: Future<Output = HttpAnswer> + Send + 'static,
{
    let (began, begun) = oneshot::channel::<bool>();
    let mut tail = Tail::new(&app, &caller, key.as_str(), run_id);
    // Watched while its work runs: its answers are streamed, their text sent as it comes
    // (live.rs).
    let watched = app.live().open(&caller, key.as_str());
    let work = move |lease: &Lease, slot: Slot| {
        // A key's first lease: nothing of its operation is journaled yet.
        let _ = began.send(lease.fence == 1);
        // Unwatched when the work ends (a block that awaited the work would hold it twice).
        work(lease, slot).map(move |answer| {
            drop(watched);
            answer
        })
    };
    // A task of its own: the operation goes on whatever happens to the stream. The task
    // is the operation's future itself, not a box inside a task (figure 12).
    let run = tokio::spawn(idempotent::once(app, caller, key, fingerprint, work));
    async move {
        if let Ok(fresh) = begun.await {
            tail.fresh = fresh;
            return respond(tail, Finish::Task(run));
        }
        let response = match run.await {
            Ok(response) => response,
            Err(err) => {
                return Problem::new(Code::Unavailable, format!("the task failed: {err}"))
                    .into_response();
            }
        };
        if !response.headers().contains_key(idempotent::REPLAYED) {
            return response;
        }
        let (status, body) = answer_of(Ok(response)).await;
        respond(tail, Finish::Answered(status, body))
    }
}
