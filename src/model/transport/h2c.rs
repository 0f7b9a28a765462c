//! HTTP/2 without TLS (prior knowledge) to a model server that takes it, each request a
//! stream on the `h2` crate's own connections: a request waiting for its answer holds
//! its stream and a small future, where hyper's pooled client holds a boxed future and a
//! spawned task more for each (bench/results.md, figure 2).
//!
//! A pool, not a fixed set: requests go to [`CONNECTIONS`] connections in turn, and a
//! new one is opened (up to [`MAX_H2C_CONNECTIONS`], one connect at a time) when every
//! stream the server allows on the open ones is taken, so a server's stream limit does
//! not queue requests in the service until their timeout. Each connection is PINGed
//! every keep-alive interval; one that does not answer within the PING timeout (a NAT or
//! balancer dropped the flow without FIN or RST) is dropped, and its requests that had no
//! answer yet go once more at once on another connection, as do requests a connection
//! refused (GOAWAY, REFUSED_STREAM) or closed before answering.
//!
//! A request given up (its timeout) before any byte of its answer makes its connection
//! suspect at once: a PING goes on it then, not at the next keep-alive tick, and no new
//! stream goes on it until the PING is answered; unanswered within the PING timeout, the
//! connection is dropped as above. So a connection gone silent costs one request its
//! timeout, not every request the pool hands it until its next keep-alive PING fails.
//! (Retiring the connection at once would cost a slow but live server a new connection
//! for each request it takes longer than the timeout over; the PING tells the two apart.)

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use h2::client::SendRequest;
use h2::{Ping, RecvStream};
use hyper::header::{CONTENT_LENGTH, HeaderValue};
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tower::ServiceExt;

use super::{
    CONNECTION_WINDOW, CONNECTIONS, Chunks, MAX_H2C_CONNECTIONS, TransportSettings, check_head,
    over_bound, tcp,
};
use crate::model::call::ModelCall;
use crate::model::error::ModelError;

pub struct H2c {
    /// `host:port` of the base URL.
    authority: String,
    /// A CONNECT tunnel through the proxy the environment names, if any.
    tunnel: Option<Tunnel<HttpConnector>>,
    settings: TransportSettings,
    pool: Mutex<Pool>,
    /// Told when a connect ends, for the requests that waited on it.
    connected: Notify,
    next: AtomicUsize,
}

#[derive(Default)]
struct Pool {
    open: Vec<Arc<Connection>>,
    connecting: usize,
}

/// One open connection: the handle that opens streams on it, the task that runs it (and
/// PINGs it), its streams in use, and whether it is suspect.
struct Connection {
    send: SendRequest<Bytes>,
    task: JoinHandle<()>,
    active: AtomicUsize,
    suspect: Arc<Suspect>,
}

/// A request on the connection was given up before any byte of its answer: no new
/// stream goes on it (`marked`) until it answers the PING its task sends when told
/// (`check`).
#[derive(Default)]
struct Suspect {
    marked: AtomicBool,
    check: Notify,
}

impl Connection {
    fn suspect(&self) -> bool {
        self.suspect.marked.load(Ordering::Relaxed)
    }
}

/// Held while a request waits for its answer's head: dropped unanswered (the request
/// timeout gave up on it), it makes the connection suspect.
struct Unheard<'a>(Option<&'a Connection>);

impl Drop for Unheard<'_> {
    fn drop(&mut self) {
        if let Some(connection) = self.0 {
            tracing::debug!(
                "a model request was given up with no byte of its answer; its connection gets no new stream until it answers a PING, sent now"
            );
            connection.suspect.marked.store(true, Ordering::Relaxed);
            connection.suspect.check.notify_one();
        }
    }
}

/// A connect under way: when it ends (made, failed, or dropped with the request that
/// made it) the pool stops counting it, and the requests waiting on it look again.
struct Connecting<'a>(&'a H2c);

impl Drop for Connecting<'_> {
    fn drop(&mut self) {
        self.0.pool.lock().expect("never poisoned").connecting -= 1;
        self.0.connected.notify_waiters();
    }
}

/// A stream taken on a connection; given back when dropped.
struct Taken(Arc<Connection>);

impl Drop for Taken {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

enum Next {
    Go(Taken),
    Connect,
    Wait,
}

impl H2c {
    pub fn new(
        authority: String,
        tunnel: Option<Tunnel<HttpConnector>>,
        settings: &TransportSettings,
    ) -> Self {
        H2c {
            authority,
            tunnel,
            settings: *settings,
            pool: Mutex::new(Pool::default()),
            connected: Notify::new(),
            next: AtomicUsize::new(0),
        }
    }

    /// POSTs `body` with the URI and headers of `head()`, and reads the answer up to
    /// `limit` bytes. A request that found its connection gone before any byte of the
    /// answer came back goes once more at once, on another connection.
    pub async fn send(
        &self,
        head: impl Fn() -> Request<()>,
        call: &ModelCall,
        limit: usize,
    ) -> Result<Response<Bytes>, ModelError> {
        let (_taken, head, incoming) = self.answer(head, call, limit).await?;
        let body = read(incoming, limit).await?;
        Ok(Response::from_parts(head, body))
    }

    /// As [`send`](Self::send), the body handed over piece by piece as it comes, within
    /// `limit` bytes in all; the stream is held (taken) until the pieces are dropped.
    pub async fn open(
        &self,
        head: impl Fn() -> Request<()>,
        call: &ModelCall,
        limit: usize,
    ) -> Result<Response<Chunks>, ModelError> {
        let (taken, head, incoming) = self.answer(head, call, limit).await?;
        let pieces = futures_util::stream::unfold(
            (taken, incoming, 0usize),
            move |(taken, mut incoming, read)| async move {
                let chunk = match incoming.data().await? {
                    Ok(chunk) => chunk,
                    Err(err) => {
                        return Some((
                            Err(ModelError::transport(err)),
                            (taken, incoming, usize::MAX),
                        ));
                    }
                };
                let _ = incoming.flow_control().release_capacity(chunk.len());
                let read = read.saturating_add(chunk.len());
                if read > limit {
                    // Past the bound: the stream is reset as it is dropped.
                    return Some((Err(over_bound(limit)), (taken, incoming, read)));
                }
                Some((Ok(chunk), (taken, incoming, read)))
            },
        );
        // Nothing more is read after an error.
        let pieces = futures_util::StreamExt::scan(pieces, false, |failed, piece| {
            let out = (!*failed).then(|| {
                *failed = piece.is_err();
                piece
            });
            std::future::ready(out)
        });
        Ok(Response::from_parts(head, Box::pin(pieces) as Chunks))
    }

    /// The answer's head and its body unread, on the stream taken for it.
    async fn answer(
        &self,
        head: impl Fn() -> Request<()>,
        call: &ModelCall,
        limit: usize,
    ) -> Result<(Taken, hyper::http::response::Parts, RecvStream), ModelError> {
        let mut again = true;
        loop {
            let taken = self.take(call).await?;
            match self.exchange(&taken, head(), call).await {
                Ok((head, incoming)) => {
                    check_head(head.status.as_u16(), &head.headers, limit)?;
                    return Ok((taken, head, incoming));
                }
                Err(Unanswered { err, unseen }) => {
                    // Refused before the server looked at it (REFUSED_STREAM, above a
                    // GOAWAY's last stream, a connection already gone), or its
                    // connection ended under it (closed, or dropped for a PING
                    // unanswered): not the stream's own reset by the server.
                    let resend = unseen
                        || err.reason() == Some(h2::Reason::REFUSED_STREAM)
                        || err.is_go_away()
                        || !err.is_reset();
                    if again && resend {
                        again = false;
                        call.sending();
                        tracing::debug!(error = %err, "the model connection ended before the request was answered; sending it again on another connection");
                        continue;
                    }
                    return Err(ModelError::transport(err));
                }
            }
        }
    }

    /// Opens the stream, sends the request and waits for the answer's head.
    async fn exchange(
        &self,
        taken: &Taken,
        mut head: Request<()>,
        call: &ModelCall,
    ) -> Result<(hyper::http::response::Parts, RecvStream), Unanswered> {
        let unseen = |err| Unanswered { err, unseen: true };
        let mut send = taken.0.send.clone().ready().await.map_err(unseen)?;
        call.on_wire();
        // Written for this send and handed to h2, which drops it once it is on the wire:
        // not held while the model thinks (a resend writes it again).
        let body = call.body();
        // As hyper's client writes it: some servers want it even over HTTP/2.
        head.headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        let (response, mut stream) = send.send_request(head, false).map_err(unseen)?;
        // Buffered whole: the window a stream opens with (64 KiB) holds a chat request.
        stream.send_data(body, true).map_err(unseen)?;
        let mut unheard = Unheard(Some(&taken.0));
        let response = response.await;
        unheard.0 = None;
        let response = response.map_err(|err| Unanswered { err, unseen: false })?;
        Ok(response.into_parts())
    }

    /// A stream on the least busy way: an open connection with a stream free (in turn),
    /// else a new connection, else (at the bound) the open one with the fewest streams
    /// taken, where h2 queues it. A connect this request makes is time on the endpoint;
    /// waiting for another's connect, or for a stream, is time in the service.
    async fn take(&self, call: &ModelCall) -> Result<Taken, ModelError> {
        loop {
            // Made before the pool is looked at, so that a connect ending after the look
            // is not missed.
            let connected = self.connected.notified();
            let next = {
                let mut pool = self.pool.lock().expect("never poisoned");
                pool.open.retain(|c| !c.task.is_finished());
                self.choose(&mut pool)
            };
            match next {
                Next::Go(taken) => return Ok(taken),
                Next::Wait => connected.await,
                Next::Connect => {
                    // Counted until it ends, made or not, or its request gives up.
                    let connecting = Connecting(self);
                    call.on_wire();
                    // Boxed: a connect (TCP and HTTP/2's handshake) is rare, a few a
                    // process, and inline it made every request's future as large.
                    let connection = Arc::new(Box::pin(self.connect()).await?);
                    connection.active.fetch_add(1, Ordering::Relaxed);
                    let mut pool = self.pool.lock().expect("never poisoned");
                    pool.open.push(connection.clone());
                    drop(pool);
                    drop(connecting);
                    return Ok(Taken(connection));
                }
            }
        }
    }

    fn choose(&self, pool: &mut Pool) -> Next {
        let open = pool.open.len();
        let free = |c: &Connection| {
            !c.suspect() && c.active.load(Ordering::Relaxed) < c.send.current_max_send_streams()
        };
        if open > 0 && (open >= CONNECTIONS || pool.connecting > 0) {
            let start = self.next.fetch_add(1, Ordering::Relaxed);
            for i in 0..open {
                let c = &pool.open[(start + i) % open];
                if free(c) {
                    c.active.fetch_add(1, Ordering::Relaxed);
                    return Next::Go(Taken(c.clone()));
                }
            }
        }
        let ways = open + pool.connecting;
        if ways < CONNECTIONS || (pool.connecting == 0 && ways < MAX_H2C_CONNECTIONS) {
            pool.connecting += 1;
            return Next::Connect;
        }
        if pool.connecting > 0 {
            return Next::Wait;
        }
        let least = pool
            .open
            .iter()
            .min_by_key(|c| (c.suspect(), c.active.load(Ordering::Relaxed)))
            .expect("at the bound, connections are open");
        least.active.fetch_add(1, Ordering::Relaxed);
        Next::Go(Taken(least.clone()))
    }

    /// A new connection, handed out once the server's SETTINGS are in (its stream limit
    /// among them): they come before its answer to a first PING.
    async fn connect(&self) -> Result<Connection, ModelError> {
        let s = &self.settings;
        let tcp = match &self.tunnel {
            None => tcp(&self.authority, s.connect_timeout).await?,
            Some(tunnel) => {
                let target = format!("http://{}", self.authority)
                    .parse()
                    .map_err(ModelError::connect)?;
                tunnel
                    .clone()
                    .oneshot(target)
                    .await
                    .map_err(ModelError::connect)?
                    .into_inner()
            }
        };
        // The stream's window no larger than an answer may be (hyper's 2 MiB at most).
        // h2 closes a connection (ENHANCE_YOUR_CALM, "too_many_data_frames") whose small
        // DATA frames (under 256 B: an SSE event each, on a streamed answer) buffered and
        // unread pass a budget: a burst of streamed answers to a service short of CPU
        // passed h2's default and failed every stream on the connection (bench/results.md,
        // figure 12 on the Responses wire). The budget set to the connection window: a
        // flood of tiny frames is still cut off.
        let (send, mut connection) = h2::client::Builder::new()
            .initial_window_size(s.max_answer_bytes.clamp(65_535, 2 << 20) as u32)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .data_frame_budget(CONNECTION_WINDOW as usize)
            .max_header_list_size(16 << 10)
            .enable_push(false)
            .handshake(tcp)
            .await
            .map_err(ModelError::connect)?;
        let mut pings = connection.ping_pong().expect("taken once, here");
        let (every, within) = (s.keep_alive, s.keep_alive_timeout);
        let (settled, settling) = oneshot::channel();
        let suspect = Arc::new(Suspect::default());
        let told = suspect.clone();
        let task = tokio::spawn(async move {
            let mut settled = Some(settled);
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    ended = &mut connection => {
                        if let Err(err) = ended {
                            tracing::debug!(error = %err, "model connection closed");
                        }
                        return;
                    }
                    _ = tick.tick() => {}
                    _ = told.check.notified() => {}
                }
                // Marked before this PING went: its answer clears the mark.
                let marked = told.marked.load(Ordering::Relaxed);
                let pong = tokio::time::timeout(within, pings.ping(Ping::opaque()));
                tokio::select! {
                    _ = &mut connection => return,
                    answered = pong => match (answered, settled.take()) {
                        (Ok(Ok(_)), Some(settled)) => { let _ = settled.send(()); }
                        (Ok(Ok(_)), None) => if marked {
                            told.marked.store(false, Ordering::Relaxed);
                        }
                        // The first PING unanswered: the connect fails.
                        (_, Some(_)) => return,
                        (_, None) => {
                            tracing::warn!(within_ms = within.as_millis() as u64, suspect = marked, "a model connection did not answer its PING; dropped, its requests go to another");
                            return;
                        }
                    }
                }
            }
        });
        settling.await.map_err(|_| {
            ModelError::connect(format!(
                "the server did not answer the connection's first PING within {} ms",
                within.as_millis()
            ))
        })?;
        Ok(Connection {
            send,
            task,
            active: AtomicUsize::new(0),
            suspect,
        })
    }
}

/// The answer's body, up to `limit` bytes: past it, the stream is reset (dropped).
async fn read(mut incoming: RecvStream, limit: usize) -> Result<Bytes, ModelError> {
    let mut body = BytesMut::new();
    while let Some(chunk) = incoming.data().await {
        let chunk = chunk.map_err(ModelError::transport)?;
        let _ = incoming.flow_control().release_capacity(chunk.len());
        if body.len() + chunk.len() > limit {
            return Err(over_bound(limit));
        }
        if body.is_empty() && incoming.is_end_stream() {
            return Ok(chunk);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// A request that got no answer; `unseen` when it never reached the server.
struct Unanswered {
    err: h2::Error,
    unseen: bool,
}
